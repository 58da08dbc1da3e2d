#!/usr/bin/env python3
"""A fake model API on 127.0.0.1 for driving the real agent CLIs in tests.

Model APIs are paid services that cannot be reached from here, so this
stands in for them -- and only for them: the CLIs themselves (Claude Code,
Codex, OpenCode, Gemini CLI) are the real npm packages.

It speaks just enough of three wire protocols, streaming included:
  * Anthropic Messages  (POST /v1/messages)   -- Claude Code, OpenCode
  * OpenAI Responses    (POST /v1/responses)  -- Codex
  * Gemini              (POST /v1beta/models/M:streamGenerateContent,
                         :generateContent, :countTokens) -- Gemini CLI

and answers with a scripted conversation chosen by --scenario:
  plain  one text answer ("Hello from the fake model.")
  tool   first a call of the CLI's own shell tool that writes a file in the
         working directory (`printf 'hello from the tool\n' > hello.txt`, or
         the command --tool-command gives), then, once the tool result comes
         back, a final text answer.
  client-tool  (Anthropic) first a call of the first `mcp__sandhold__*`
         tool offered (a client tool; not `permission`) with
         {"query": "the question"}, then a final text quoting the tool's
         result: "The client tool said: <result>".

The shell tool is found in the request's tool list (Bash / bash / shell /
exec_command / ...), and its arguments are shaped after that tool's JSON
schema, so CLI upgrades that rename or reshape the tool keep working.

Prints `PORT=<n>` on its first stdout line once it is listening. Every
request is appended as one JSON line to --log when given (path, the auth
headers it carried, body). While the file named by --stall-file exists,
every POST waits before it is answered (a slow model); while the file named
by --hold-tool-results exists, only requests that carry a tool's result
wait (the second turn).

Every answer reports its usage as the real APIs do, always the same
numbers (USAGE): Anthropic's with cache reads and writes (in
`message_start`, output in the cumulative `message_delta`), OpenAI's
Responses with cached input, Gemini's `usageMetadata`.
"""

import argparse
import json
import os
import sys
import time
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOOL_COMMAND = "printf 'hello from the tool\\n' > hello.txt"
PLAIN_TEXT = "Hello from the fake model."
FINAL_TEXT = "I wrote hello.txt."
SHELL_TOOL_NAMES = ("bash", "shell", "exec_command", "local_shell", "container.exec", "run_shell_command")

ARGS = None
LOG_LOCK = threading.Lock()

# What every answer reports: uncached input, output, cache reads, cache
# writes (Anthropic's numbers; OpenAI and Gemini count the cached input
# within their input).
USAGE = {"input": 12, "output": 7, "cache_read": 5, "cache_write": 3}


AUTH_HEADERS = ("x-api-key", "authorization", "x-goog-api-key")


def log_request(path, body, headers=None):
    if not ARGS.log:
        return
    auth = {h: headers.get(h) for h in AUTH_HEADERS if headers is not None and headers.get(h)}
    with LOG_LOCK, open(ARGS.log, "a", encoding="utf-8") as f:
        f.write(json.dumps({"path": path, "auth": auth, "body": body}) + "\n")


def stall(body=None):
    """While --stall-file exists, hold every model answer back; while
    --hold-tool-results exists, those answering a tool's result."""
    while ARGS.stall_file and os.path.exists(ARGS.stall_file):
        time.sleep(0.1)
    if ARGS.hold_tool_results and has_tool_result(body or {}):
        while os.path.exists(ARGS.hold_tool_results):
            time.sleep(0.1)


def has_tool_result(body):
    return anthropic_has_tool_result(body) or responses_has_tool_output(body) or gemini_has_function_response(body)


def shell_args_for(schema):
    """Arguments for a shell tool, shaped by its JSON schema."""
    props = (schema or {}).get("properties", {})
    args = {}
    command = props.get("command") or props.get("cmd")
    key = "command" if "command" in props else ("cmd" if "cmd" in props else "command")
    if command and command.get("type") == "array":
        args[key] = ["bash", "-lc", ARGS.tool_command]
    else:
        args[key] = ARGS.tool_command
    if "description" in props:
        args["description"] = "Write hello.txt"
    return args


# ----------------------------------------------------------------- Anthropic

def anthropic_has_tool_result(body):
    for msg in body.get("messages", []):
        content = msg.get("content")
        if isinstance(content, list):
            for block in content:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    return True
    return False


def anthropic_shell_tool(body):
    for tool in body.get("tools") or []:
        if tool.get("name", "").lower() in SHELL_TOOL_NAMES:
            return tool
    return None


def anthropic_client_tool(body):
    for tool in body.get("tools") or []:
        name = tool.get("name", "")
        if name.startswith("mcp__sandhold__") and name != "mcp__sandhold__permission":
            return tool
    return None


def anthropic_tool_result_text(body):
    """The text of the last tool_result block of the conversation."""
    text = ""
    for msg in body.get("messages", []):
        content = msg.get("content")
        if not isinstance(content, list):
            continue
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                inner = block.get("content")
                if isinstance(inner, str):
                    text = inner
                elif isinstance(inner, list):
                    text = "".join(b.get("text", "") for b in inner if isinstance(b, dict))
    return text


def anthropic_turn(body):
    """(blocks, stop_reason) for this request."""
    if ARGS.scenario == "client-tool":
        tool = anthropic_client_tool(body)
        if tool and not anthropic_has_tool_result(body):
            return [{"type": "tool_use", "id": "toolu_fake_client", "name": tool["name"],
                     "input": {"query": "the question"}}], "tool_use"
        if anthropic_has_tool_result(body):
            return [{"type": "text", "text": "The client tool said: " + anthropic_tool_result_text(body)}], "end_turn"
    tool = anthropic_shell_tool(body)
    if ARGS.scenario == "tool" and tool and not anthropic_has_tool_result(body):
        args = shell_args_for(tool.get("input_schema"))
        return [{"type": "tool_use", "id": "toolu_fake_1", "name": tool["name"], "input": args}], "tool_use"
    text = FINAL_TEXT if anthropic_has_tool_result(body) else PLAIN_TEXT
    return [{"type": "text", "text": text}], "end_turn"


def anthropic_sse(handler, body):
    blocks, stop = anthropic_turn(body)
    model = body.get("model", "fake-model")
    usage_in = {"input_tokens": USAGE["input"], "output_tokens": 1,
                "cache_creation_input_tokens": USAGE["cache_write"], "cache_read_input_tokens": USAGE["cache_read"]}
    events = [("message_start", {"type": "message_start", "message": {
        "id": "msg_fake", "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": usage_in}})]
    for i, block in enumerate(blocks):
        if block["type"] == "text":
            events.append(("content_block_start", {"type": "content_block_start", "index": i,
                                                   "content_block": {"type": "text", "text": ""}}))
            events.append(("content_block_delta", {"type": "content_block_delta", "index": i,
                                                   "delta": {"type": "text_delta", "text": block["text"]}}))
        else:
            events.append(("content_block_start", {"type": "content_block_start", "index": i, "content_block": {
                "type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}}))
            events.append(("content_block_delta", {"type": "content_block_delta", "index": i, "delta": {
                "type": "input_json_delta", "partial_json": json.dumps(block["input"])}}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    events.append(("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                     "usage": {"output_tokens": USAGE["output"]}}))
    events.append(("message_stop", {"type": "message_stop"}))
    handler.send_response(200)
    handler.send_header("content-type", "text/event-stream")
    handler.send_header("cache-control", "no-cache")
    handler.end_headers()
    for name, data in events:
        handler.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
        handler.wfile.flush()


def anthropic_json(handler, body):
    blocks, stop = anthropic_turn(body)
    send_json(handler, 200, {"id": "msg_fake", "type": "message", "role": "assistant",
                             "model": body.get("model", "fake-model"), "content": blocks, "stop_reason": stop,
                             "stop_sequence": None, "usage": {
                                 "input_tokens": USAGE["input"], "output_tokens": USAGE["output"],
                                 "cache_creation_input_tokens": USAGE["cache_write"],
                                 "cache_read_input_tokens": USAGE["cache_read"]}})


# ----------------------------------------------------------------- OpenAI Responses

def responses_has_tool_output(body):
    items = body.get("input")
    if isinstance(items, list):
        return any(isinstance(i, dict) and i.get("type") in ("function_call_output", "custom_tool_call_output",
                                                               "local_shell_call_output") for i in items)
    return False


def responses_shell_tool(body):
    for tool in body.get("tools") or []:
        name = tool.get("name") or tool.get("type", "")
        if name.lower() in SHELL_TOOL_NAMES:
            return tool
    return None


def responses_sse(handler, body):
    model = body.get("model", "fake-model")
    tool = responses_shell_tool(body)
    seq = [0]

    def event(data):
        data["sequence_number"] = seq[0]
        seq[0] += 1
        handler.wfile.write(f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode())
        handler.wfile.flush()

    handler.send_response(200)
    handler.send_header("content-type", "text/event-stream")
    handler.send_header("cache-control", "no-cache")
    handler.end_headers()
    response = {"id": "resp_fake", "object": "response", "model": model, "status": "in_progress", "output": []}
    event({"type": "response.created", "response": response})
    if ARGS.scenario == "tool" and tool and not responses_has_tool_output(body):
        args = shell_args_for(tool.get("parameters"))
        item = {"type": "function_call", "id": "fc_fake_1", "call_id": "call_fake_1", "name": tool.get("name", "shell"),
                "arguments": json.dumps(args), "status": "completed"}
        event({"type": "response.output_item.added", "output_index": 0, "item": dict(item, arguments="")})
        event({"type": "response.function_call_arguments.delta", "output_index": 0, "item_id": item["id"],
               "delta": item["arguments"]})
        event({"type": "response.function_call_arguments.done", "output_index": 0, "item_id": item["id"],
               "arguments": item["arguments"]})
        event({"type": "response.output_item.done", "output_index": 0, "item": item})
        output = [item]
    else:
        text = FINAL_TEXT if responses_has_tool_output(body) else PLAIN_TEXT
        item = {"type": "message", "id": "msg_fake_1", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}
        event({"type": "response.output_item.added", "output_index": 0,
               "item": dict(item, content=[], status="in_progress")})
        event({"type": "response.content_part.added", "output_index": 0, "item_id": item["id"], "content_index": 0,
               "part": {"type": "output_text", "text": "", "annotations": []}})
        event({"type": "response.output_text.delta", "output_index": 0, "item_id": item["id"], "content_index": 0,
               "delta": text})
        event({"type": "response.output_text.done", "output_index": 0, "item_id": item["id"], "content_index": 0,
               "text": text})
        event({"type": "response.content_part.done", "output_index": 0, "item_id": item["id"], "content_index": 0,
               "part": item["content"][0]})
        event({"type": "response.output_item.done", "output_index": 0, "item": item})
        output = [item]
    done = dict(response, status="completed", output=output,
                usage={"input_tokens": USAGE["input"] + USAGE["cache_read"],
                       "input_tokens_details": {"cached_tokens": USAGE["cache_read"]}, "output_tokens": USAGE["output"],
                       "output_tokens_details": {"reasoning_tokens": 0},
                       "total_tokens": USAGE["input"] + USAGE["cache_read"] + USAGE["output"]})
    event({"type": "response.completed", "response": done})


# ----------------------------------------------------------------- Gemini

def gemini_has_function_response(body):
    for content in body.get("contents") or []:
        for part in content.get("parts") or []:
            if isinstance(part, dict) and "functionResponse" in part:
                return True
    return False


def gemini_shell_tool(body):
    for tool in body.get("tools") or []:
        for decl in tool.get("functionDeclarations") or []:
            if decl.get("name", "").lower() in SHELL_TOOL_NAMES:
                return decl
    return None


def gemini_response(body):
    """The one candidate answering this request, with usage."""
    tool = gemini_shell_tool(body)
    if ARGS.scenario == "tool" and tool and not gemini_has_function_response(body):
        schema = tool.get("parametersJsonSchema") or tool.get("parameters")
        parts = [{"functionCall": {"name": tool["name"], "args": shell_args_for(schema)}}]
    else:
        parts = [{"text": FINAL_TEXT if gemini_has_function_response(body) else PLAIN_TEXT}]
    return {"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": USAGE["input"] + USAGE["cache_read"],
                              "cachedContentTokenCount": USAGE["cache_read"],
                              "candidatesTokenCount": USAGE["output"],
                              "totalTokenCount": USAGE["input"] + USAGE["cache_read"] + USAGE["output"]},
            "modelVersion": "fake-model", "responseId": "resp_fake"}


def gemini_sse(handler, body):
    handler.send_response(200)
    handler.send_header("content-type", "text/event-stream")
    handler.send_header("cache-control", "no-cache")
    handler.end_headers()
    handler.wfile.write(f"data: {json.dumps(gemini_response(body))}\r\n\r\n".encode())
    handler.wfile.flush()


# ----------------------------------------------------------------- HTTP

def send_json(handler, status, obj):
    data = json.dumps(obj).encode()
    handler.send_response(status)
    handler.send_header("content-type", "application/json")
    handler.send_header("content-length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        if ARGS.verbose:
            sys.stderr.write("fake-model: " + (fmt % args) + "\n")

    def do_HEAD(self):
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_GET(self):
        path = self.path.split("?")[0]
        log_request(path, None, self.headers)
        if path.endswith("/models"):
            send_json(self, 200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
        else:
            send_json(self, 200, {})

    def do_POST(self):
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            send_json(self, 400, {"error": {"message": "bad json"}})
            return
        path = self.path.split("?")[0]
        log_request(path, body, self.headers)
        stall(body)
        # Streaming responses end with the connection.
        if path.endswith("/messages/count_tokens"):
            send_json(self, 200, {"input_tokens": 12})
        elif path.endswith("/messages"):
            if body.get("stream"):
                self.close_connection = True
                anthropic_sse(self, body)
            else:
                anthropic_json(self, body)
        elif path.endswith("/responses"):
            self.close_connection = True
            responses_sse(self, body)
        elif path.endswith(":streamGenerateContent"):
            self.close_connection = True
            gemini_sse(self, body)
        elif path.endswith(":generateContent"):
            send_json(self, 200, gemini_response(body))
        elif path.endswith(":countTokens"):
            send_json(self, 200, {"totalTokens": 12})
        else:
            send_json(self, 404, {"error": {"message": f"no fake for {path}"}})


def main():
    global ARGS
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    p.add_argument("--scenario", choices=["plain", "tool", "client-tool"], default="plain")
    p.add_argument("--log")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--stall-file", help="while this file exists, model answers wait")
    p.add_argument("--hold-tool-results", help="while this file exists, answers to a tool's result wait")
    p.add_argument("--tool-command", default=TOOL_COMMAND, help="the shell command the tool scenario runs")
    ARGS = p.parse_args()
    server = ThreadingHTTPServer((ARGS.host, ARGS.port), Handler)
    print(f"PORT={server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
