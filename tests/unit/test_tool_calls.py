import pytest

from seed_agents.tool_calls import carries_markup, format_tool_call, parse_tool_calls


def test_parses_hermes_calls_and_strips_them_from_content():
    text = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    content, calls, invalid = parse_tool_calls(text)
    assert content == "Let me add."
    assert [(c["name"], c["args"]) for c in calls] == [("add", {"a": 1, "b": 2})]
    assert invalid == []


def test_arguments_as_json_string_and_unclosed_block():
    _, calls, _ = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"x\\": 3}"}')
    assert calls[0]["args"] == {"x": 3}


def test_malformed_calls_become_invalid_not_exceptions():
    text = "<tool_call>{not json}</tool_call><tool_call>{\"arguments\": {}}</tool_call><tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>"
    content, calls, invalid = parse_tool_calls(text)
    assert calls == []
    assert [i["error"].split(":")[0] for i in invalid] == ["not JSON", "missing string field 'name'", "arguments is not a JSON object"]
    assert all(i["id"] for i in invalid)


def test_roundtrip_with_formatter():
    _, calls, _ = parse_tool_calls(format_tool_call("mul", {"a": 2.5, "b": "x"}))
    assert calls[0]["name"] == "mul" and calls[0]["args"] == {"a": 2.5, "b": "x"}


def test_text_without_calls_is_untouched():
    assert parse_tool_calls("  go north ") == ("go north", [], [])


@pytest.mark.parametrize(("text", "markup"), [
    ("The area is 5.", False), ("<tool_response>\n5", True), ("5\n</tool_response>", True),
    ('<tool_call>\n{"name": "add"', True), ("5</tool_call>", True), ("5<|im_end|>", True), ("a < b > c", False),
    # what a learning run wrote once the grammar denied it the exact tags
    ("<tool_response >\nThe area of Grothruthdux is 7810.\n</tool_response >", True),
    ("<tool_response_json>\n{", True), ("<tool_response text>\n5", True), ("The tool responded: 5", False),
])
def test_carries_markup(text, markup):
    assert carries_markup(text) is markup
