#!/usr/bin/env python3
"""A minimal Agent Client Protocol agent for tests of Sandhold's ACP client.

It speaks JSON-RPC 2.0 over stdio (one JSON object a line): `initialize`
(advertising `loadSession` and the MCP transports given by --mcp), then
`session/new` / `session/load` (and `session/set_mode`), and answers each `session/prompt` with one
`agent_message_chunk` that says how many MCP servers the session was given,
then `end_turn`. Every request it receives is appended as one JSON line to
--log, so a test can assert on exactly what the client sent (the
`mcpServers` of `session/new`, the `cwd`, ...).
"""

import argparse
import json
import sys


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--log", required=True)
    parser.add_argument("--mcp", default="http,sse", help="MCP transports advertised besides stdio")
    args = parser.parse_args()
    transports = [t for t in args.mcp.split(",") if t]
    servers = {}

    def send(message):
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        message = json.loads(line)
        if "method" not in message:
            continue  # a response to something we never ask
        with open(args.log, "a", encoding="utf-8") as f:
            f.write(json.dumps(message) + "\n")
        method, params, rid = message["method"], message.get("params") or {}, message.get("id")
        if method == "initialize":
            caps = {"loadSession": True, "mcpCapabilities": {t: True for t in transports}}
            send({"jsonrpc": "2.0", "id": rid, "result": {"protocolVersion": 1, "agentCapabilities": caps}})
        elif method in ("session/new", "session/load"):
            session = params.get("sessionId") or "fake-session-1"
            servers[session] = params.get("mcpServers") or []
            send({"jsonrpc": "2.0", "id": rid, "result": {"sessionId": session} if method == "session/new" else {}})
        elif method == "session/set_mode":
            send({"jsonrpc": "2.0", "id": rid, "result": {}})
        elif method == "session/prompt":
            session = params.get("sessionId")
            given = servers.get(session, [])
            text = f"{len(given)} MCP servers" + (": " + ",".join(s.get("name", "?") for s in given) if given else "")
            update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}
            send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": session, "update": update}})
            send({"jsonrpc": "2.0", "id": rid, "result": {"stopReason": "end_turn"}})
        elif rid is not None:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"method not found: {method}"}})


if __name__ == "__main__":
    main()
