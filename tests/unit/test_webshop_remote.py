"""The HTTP adapter against a fake WebShop server: the original app's routes and page
shapes (instruction div, ``btn`` buttons, ``product-link`` ASINs, radio options, a
``#reward`` on the done page), served from the synthetic catalog by the stdlib."""

import ast
import html
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

import pytest

from seed_agents.tools.webshop import WebShopSuite, get_reward
from seed_agents.tools.webshop.remote import parse_page

SUITE = WebShopSuite(seed=0)
CATALOG = SUITE.catalog


def _page(instruction, body):
    return (f"<html><head><title>WebShop</title><style>.x {{}}</style></head><body>"
            f'<div id="instruction-text"><h4>Instruction:<br>{html.escape(instruction)}</h4></div>{body}'
            f"<script>var notShown = 1;</script></body></html>")


def _btn(text, cls="btn btn-primary"):
    return f'<form method="post"><button type="submit" class="{cls}">{html.escape(text)}</button></form>'


def render(path):
    """The HTML the original app would serve for ``path`` (only what the adapter reads)."""
    parts = [unquote(p) for p in path.strip("/").split("/")]
    route, session = (parts[0], parts[1]) if len(parts) > 1 else ("index", parts[0])
    goal = CATALOG.goals[int(session.split("_")[-1])]
    back = _btn("Back to Search", "btn btn-success")
    if route == "index":
        return _page(goal.instruction, '<input id="search_input" type="text" name="search_query"/>'
                     + _btn("Search", "btn btn-success"))
    keywords = parts[2] if route != "done" else ""
    keywords = " ".join(ast.literal_eval(keywords)) if keywords.startswith("[") else keywords
    if route == "search_results":
        page = int(parts[3])
        hits = CATALOG.search(keywords)
        rows = "".join(f'<div><h4><a class="product-link" href="#">{p.asin}</a></h4><h4>{html.escape(p.title)}</h4>'
                       f"<h5>{p.price_tag}</h5></div>" for p in hits[(page - 1) * 10:page * 10])
        nav = (_btn("< Prev") if page > 1 else "") + _btn("Next >")
        return _page(goal.instruction, f"{back}<h3>Page {page} (Total results: {len(hits)})</h3>{nav}{rows}")
    product = CATALOG.by_asin[parts[2]]
    options = ast.literal_eval(parts[-1])
    if route == "done":
        reward, _ = get_reward(product, goal, product.price, options)
        return ("<html><body><h1>Thank you for shopping with us!</h1><div style=\"display:none\">"
                f'<h4 id="goal-category">category<pre>{goal.category}</pre></h4></div>'
                f'<h3 id="reward">Your score (min 0.0, max 1.0)<pre>{reward}</pre></h3></body></html>')
    if route == "item_sub_page":
        return _page(goal.instruction, f"{back}{_btn('< Prev')}<p>{html.escape(product.description)}</p>")
    radios = "".join(f"<h4>{name}</h4>" + "".join(
        f'<input type="radio" name="{name}" value="{html.escape(v)}"><label>{html.escape(v)}</label>' for v in values)
        for name, values in product.options.items())
    subs = "".join(_btn(s) for s in ("Description", "Features", "Reviews"))
    return _page(goal.instruction, f"{back}{_btn('< Prev')}{radios}<h2>{html.escape(product.title)}</h2>"
                 f"<h4>Price: {product.price_tag}</h4>{subs}{_btn('Buy Now', 'btn btn-lg purchase')}")


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the stdlib's name
        body = render(self.path).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_parse_page_reads_clickables_and_visible_text():
    page = parse_page(render(f"/search_results/s_fixed_0/{['black', 'white', 'red']}/2"))
    assert page.lines[:3] == ["Instruction:", CATALOG.goals[0].instruction, "[Back to Search]"]
    assert [c[0] for c in page.clickables[:3]] == ["Back to Search", "< Prev", "Next >"]
    assert all(kind == "product" for _, kind, _ in page.clickables[3:]) and len(page.clickables) == 13
    assert "notShown" not in page.text and "WebShop" not in page.text and not page.has_search_bar
    done = parse_page(render("/done/s_fixed_0/SYN0000000/{}"))
    assert "category" not in done.text and done.by_id["goal-category"] == f"category {CATALOG.goals[0].category}"


def play(env, actions):
    obs = [env.reset()]
    obs += [env.step(a) for a in actions]
    env.close()
    return obs


def test_a_winning_episode_over_http_matches_the_in_process_env(server_url):
    task = SUITE.tasks("test", 3)[2]
    goal = task.data
    actions = [f"search[{goal['instruction']}]", f"click[{goal['asin']}]", "click[Description]", "click[< Prev]",
               *(f"click[{v}]" for v in goal["options"]), "click[Buy Now]"]
    remote = play(WebShopSuite(server_url=server_url).make_env(task), actions)
    local = play(SUITE.make_env(task), actions)
    assert [o.invalid for o in remote] == [False] * len(remote)
    assert remote[0].admissible_actions == local[0].admissible_actions == ["search[<query>]"]
    assert goal["instruction"] in remote[0].text
    asins = lambda o: [a for a in o.admissible_actions if a.startswith("click[SYN")]  # noqa: E731
    assert asins(remote[1]) == asins(local[1])
    assert remote[2].admissible_actions == local[2].admissible_actions  # item page: same clickables, same order
    assert remote[-1].reward == local[-1].reward == 1.0 and remote[-1].won and remote[-1].done
    assert remote[-1].info["game_type"] == goal["game_type"] and remote[-1].info["page"] == "done"
    assert [o.reward for o in remote] == [o.reward for o in local]


def test_a_partial_purchase_gets_the_same_reward_as_in_process(server_url):
    task = next(t for t in SUITE.tasks("test", 20) if t.data["options"])
    actions = [f"search[{task.data['instruction']}]", f"click[{task.data['asin']}]", "click[Buy Now]"]  # no options
    remote = play(WebShopSuite(server_url=server_url).make_env(task), actions)
    local = play(SUITE.make_env(task), actions)
    assert remote[-1].reward == local[-1].reward < 1 and remote[-1].lost


def test_invalid_actions_over_http(server_url):
    env = WebShopSuite(server_url=server_url).make_env(SUITE.tasks("test", 1)[0])
    first = env.reset()
    for action in ("click[Search]", "click[Buy Now]", "dance", "search[]"):
        obs = env.step(action)
        assert obs.invalid and obs.admissible_actions == first.admissible_actions and first.text in obs.text
    results = env.step("search[shampoo]")
    assert not results.invalid and env.step("search[lipstick]").invalid
    assert env.step("click[Back to Search]").admissible_actions == first.admissible_actions
    env.close()


def test_a_server_that_is_not_there_gets_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = WebShopSuite(server_url=f"http://127.0.0.1:{port}").make_env(SUITE.tasks("test", 1)[0])
    with pytest.raises(RuntimeError, match=f"WebShop server at http://127.0.0.1:{port} failed"):
        env.reset()
    env.close()
