"""Undeclared tool calls (PRODUCT §5.4): an answer that calls a tool the request did not declare
(a stale tool from an earlier turn, an invented one) is not an answer the client can use.

`declared_tools(protocol, body)` reads the function-tool names of an upstream request body;
`undeclared_in_frame` finds a call to any other name in one SSE frame of an upstream stream,
`undeclared_in_answer` in a whole (non-streaming) answer. Only function-style calls are checked
(Responses `function_call`/`custom_tool_call`, Chat `tool_calls`/`function_call`, Anthropic
`tool_use`): hosted tools answer with item types of their own. When the request can declare
tools the body does not list (`tool_search`, `additional_tools`), the check is off (None).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal

from providers.wire.sse import SSEEvent

ToolProtocol = Literal["responses", "chat", "anthropic"]

# Request tools/items that add tools at run time: the declared set is not knowable up front.
_DYNAMIC_TOOL_TYPES = frozenset({"tool_search", "additional_tools", "tool_search_output"})
_RESPONSES_CALL_ITEMS = frozenset({"function_call", "custom_tool_call"})


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _responses_tool_names(tools: Iterable[Any]) -> Iterator[str] | None:
    names: list[str] = []
    for tool in tools:
        tool = _mapping(tool)
        ttype = tool.get("type")
        if ttype in _DYNAMIC_TOOL_TYPES:
            return None
        if ttype == "namespace":
            inner = _responses_tool_names(_list(tool.get("tools")))
            if inner is None:
                return None
            names.extend(inner)
        if isinstance(tool.get("name"), str):
            names.append(tool["name"])
    return iter(names)


def declared_tools(protocol: ToolProtocol, body: Mapping[str, Any]) -> frozenset[str] | None:
    """The tool names an upstream request body (in the upstream's `protocol`) declares, or None
    when its tools cannot be known from the body (the check is then skipped)."""
    tools = _list(body.get("tools"))
    if protocol == "responses":
        items = body.get("input")
        for item in items if isinstance(items, list) else []:
            if _mapping(item).get("type") in _DYNAMIC_TOOL_TYPES:
                return None
        found = _responses_tool_names(tools)
        return None if found is None else frozenset(found)
    names: set[str] = set()
    if protocol == "chat":
        for tool in tools:
            tool = _mapping(tool)
            for key in ("function", "custom"):
                name = _mapping(tool.get(key)).get("name")
                if isinstance(name, str):
                    names.add(name)
        for fn in _list(body.get("functions")):  # the legacy `functions` list
            name = _mapping(fn).get("name")
            if isinstance(name, str):
                names.add(name)
        return frozenset(names)
    for tool in tools:
        name = _mapping(tool).get("name")
        if isinstance(name, str):
            names.add(name)
    return frozenset(names)


def _responses_item_call(item: Any) -> str | None:
    item = _mapping(item)
    if item.get("type") in _RESPONSES_CALL_ITEMS:
        name = item.get("name")
        return name if isinstance(name, str) else ""
    return None


def _chat_message_calls(message: Mapping[str, Any]) -> Iterator[str]:
    for call in _list(message.get("tool_calls")):
        name = _mapping(_mapping(call).get("function")).get("name")
        if isinstance(name, str) and name:
            yield name
    fn = _mapping(message.get("function_call")).get("name")
    if isinstance(fn, str) and fn:
        yield fn


def calls_in_payload(protocol: ToolProtocol, payload: Mapping[str, Any]) -> Iterator[str]:
    """Names of the tool calls one decoded stream frame starts (or carries whole)."""
    if protocol == "responses":
        etype = payload.get("type")
        if etype in ("response.output_item.added", "response.output_item.done"):
            name = _responses_item_call(payload.get("item"))
            if name is not None:
                yield name
        elif etype in ("response.created", "response.completed", "response.incomplete"):
            yield from calls_in_answer("responses", _mapping(payload.get("response")))
    elif protocol == "chat":
        for choice in _list(payload.get("choices")):
            choice = _mapping(choice)
            yield from _chat_message_calls(_mapping(choice.get("delta")))
            yield from _chat_message_calls(_mapping(choice.get("message")))
    elif payload.get("type") == "content_block_start":
        block = _mapping(payload.get("content_block"))
        if block.get("type") == "tool_use" and isinstance(block.get("name"), str):
            yield block["name"]


def calls_in_answer(protocol: ToolProtocol, data: Mapping[str, Any]) -> Iterator[str]:
    """Names of every tool call in a whole answer body."""
    if protocol == "responses":
        for item in _list(data.get("output")):
            name = _responses_item_call(item)
            if name is not None:
                yield name
    elif protocol == "chat":
        for choice in _list(data.get("choices")):
            yield from _chat_message_calls(_mapping(_mapping(choice).get("message")))
    else:
        for block in _list(data.get("content")):
            block = _mapping(block)
            if block.get("type") == "tool_use" and isinstance(block.get("name"), str):
                yield block["name"]


def undeclared_in_answer(
    protocol: ToolProtocol, data: Mapping[str, Any], declared: frozenset[str] | None
) -> str | None:
    """The first tool a whole answer calls that `declared` does not name, else None."""
    if declared is None:
        return None
    return next((n for n in calls_in_answer(protocol, data) if n not in declared), None)


def undeclared_in_frame(
    protocol: ToolProtocol, event: SSEEvent, declared: frozenset[str] | None
) -> str | None:
    """The first undeclared tool one stream frame calls, else None. A cheap byte test first:
    only frames that can carry a call are decoded."""
    if declared is None or b'"name"' not in event.raw or not event.has_data:
        return None
    try:
        payload = event.json()  # decoded once: the commit scanner has usually done it already
    except ValueError:
        return None
    if not isinstance(payload, Mapping):
        return None
    return next((n for n in calls_in_payload(protocol, payload) if n not in declared), None)


def undeclared_at(
    protocol: ToolProtocol, events: Iterable[SSEEvent], declared: frozenset[str] | None
) -> tuple[int, str] | None:
    """(index, tool name) of the first frame of `events` that calls an undeclared tool."""
    if declared is None:
        return None
    for i, event in enumerate(events):
        if b'"name"' in event.raw:  # the cheap test inline: this runs for every frame
            name = undeclared_in_frame(protocol, event, declared)
            if name is not None:
                return i, name
    return None
