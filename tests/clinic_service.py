"""A small clinic booking API for tests: "your own API", not the library demo.

OpenAPI 3 (FastAPI), two reads, two POSTs and a DELETE, an API key in ``X-Api-Key``.
Every request is logged (``app.state.log``) so a test can prove that no replay wrote to
it. ``resettable=True`` makes it a sandbox: ``POST /reset`` (not in the spec) empties
bookings and the waitlist. ``ClinicServer`` runs it with uvicorn on a loopback port (a
real service, real sockets).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Literal, Self

import uvicorn
from fastapi import Depends, FastAPI, Header, HTTPException, Request
from pydantic import BaseModel, Field

SLOTS = {"2025-03-03": ["09:00", "10:30", "14:00"], "2025-03-04": ["11:00"]}
Day = Literal["2025-03-03", "2025-03-04"]  # the days the clinic opens


class BookingIn(BaseModel):
    patient: str = Field(min_length=1, max_length=40, description="The patient's name.")
    date: str = Field(description="YYYY-MM-DD")
    time: str = Field(description="HH:MM, one of the free slots")


class Booking(BookingIn):
    booking_id: int


class WaitlistIn(BaseModel):
    date: Day = Field(description="The day to wait for a free slot on.")


def create_app(*, api_key: str | None = None, resettable: bool = False) -> FastAPI:
    app = FastAPI(title="Clinic")
    app.state.bookings = {}
    app.state.waitlist = []
    app.state.log = []

    async def check_key(request: Request, x_api_key: str | None = Header(None)) -> None:
        app.state.log.append((request.method, request.url.path))
        if api_key is not None and x_api_key != api_key:
            raise HTTPException(401, "missing or wrong X-Api-Key")

    def free(date: str) -> list[str]:
        taken = {(b.date, b.time) for b in app.state.bookings.values()}
        return [t for t in SLOTS.get(date, []) if (date, t) not in taken]

    @app.get("/slots", operation_id="list_slots", summary="Free appointment slots on a date",
             dependencies=[Depends(check_key)])
    def list_slots(date: str) -> dict[str, Any]:
        return {"date": date, "free": free(date)}

    @app.get("/bookings/{booking_id}", operation_id="get_booking", summary="One booking by id",
             dependencies=[Depends(check_key)])
    def get_booking(booking_id: int) -> Booking:
        if booking_id not in app.state.bookings:
            raise HTTPException(404, f"no booking {booking_id}")
        return app.state.bookings[booking_id]

    @app.post("/bookings", operation_id="book_slot", status_code=201, summary="Book a free slot for a patient",
              dependencies=[Depends(check_key)])
    def book_slot(body: BookingIn) -> Booking:
        if body.time not in free(body.date):
            raise HTTPException(409, f"{body.date} {body.time} is not free")
        booking = Booking(booking_id=len(app.state.bookings) + 1, **body.model_dump())
        app.state.bookings[booking.booking_id] = booking
        return booking

    @app.delete("/bookings/{booking_id}", operation_id="cancel_booking", summary="Cancel a booking",
                dependencies=[Depends(check_key)])
    def cancel_booking(booking_id: int) -> dict[str, Any]:
        if app.state.bookings.pop(booking_id, None) is None:
            raise HTTPException(404, f"no booking {booking_id}")
        return {"cancelled": booking_id}

    @app.post("/waitlist", operation_id="join_waitlist", status_code=201,
              summary="Join the waitlist for a day; answers your position", dependencies=[Depends(check_key)])
    def join_waitlist(body: WaitlistIn) -> dict[str, Any]:
        app.state.waitlist.append(body.date)
        return {"date": body.date, "position": len(app.state.waitlist)}

    if resettable:
        @app.post("/reset", include_in_schema=False, dependencies=[Depends(check_key)])
        def reset() -> dict[str, Any]:
            dropped = len(app.state.bookings) + len(app.state.waitlist)
            app.state.bookings, app.state.waitlist = {}, []
            return {"reset": True, "dropped": dropped}

    return app


def clinic_reward(task: Any, state: dict[str, Any]) -> float:
    """1.0 when the answer names the first free slot the task expects (``data["expect"]``)."""
    expect = (getattr(task, "data", None) or {}).get("expect")
    answer = state.get("answer") or ""
    return 1.0 if expect and expect in answer else 0.0


def clinic_verifier(session: Any, calls: list[Any]) -> float:
    """The gateway's form: 1.0 when the last reply mentions a slot time."""
    text = calls[-1].text if calls else ""
    return 1.0 if any(t in text for ts in SLOTS.values() for t in ts) else 0.0


class ClinicServer:
    """The clinic on a free loopback port in a thread; ``url`` is its base URL."""

    def __init__(self, api_key: str | None = None, *, resettable: bool = False) -> None:
        self.app = create_app(api_key=api_key, resettable=resettable)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def mutating(self) -> int:
        return sum(m not in ("GET", "HEAD") for m, _ in self.app.state.log)

    def __enter__(self) -> Self:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the clinic service did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
