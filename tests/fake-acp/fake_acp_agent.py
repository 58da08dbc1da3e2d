#!/usr/bin/env python3
"""A minimal Agent Client Protocol agent for tests of Sandhold's ACP client.

It speaks JSON-RPC 2.0 over stdio (one JSON object a line): `initialize`
(advertising `loadSession` and the MCP transports given by --mcp), then
`session/new` / `session/load` (and `session/set_mode`), and answers each `session/prompt` with one
`agent_message_chunk` that says how many MCP servers the session was given,
then `end_turn`. Every request it receives is appended as one JSON line to
--log, so a test can assert on exactly what the client sent (the
`mcpServers` of `session/new`, the `cwd`, ...).

With --ask CMD, each prompt first asks the client's permission to run the
shell command CMD (`session/request_permission`, kind `execute`, options
allow_once and reject_once) and runs it in the session's cwd only if an
allow option is selected; its message then says "ran: CMD" or
"refused: CMD".
"""

import argparse
import json
import subprocess
import sys


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--log", required=True)
    parser.add_argument("--mcp", default="http,sse", help="MCP transports advertised besides stdio")
    parser.add_argument("--ask", help="a shell command to ask permission for, and run if allowed")
    args = parser.parse_args()
    transports = [t for t in args.mcp.split(",") if t]
    servers = {}
    cwds = {}

    def ask(session):
        """Ask to run --ask; True when an allow option was selected."""
        options = [
            {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
            {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
        ]
        tool_call = {"toolCallId": "call-1", "title": args.ask, "kind": "execute", "rawInput": {"command": args.ask}}
        send({"jsonrpc": "2.0", "id": "perm-1", "method": "session/request_permission",
              "params": {"sessionId": session, "toolCall": tool_call, "options": options}})
        for reply in sys.stdin:
            reply = json.loads(reply)
            if reply.get("id") == "perm-1" and "method" not in reply:
                outcome = (reply.get("result") or {}).get("outcome") or {}
                return outcome.get("outcome") == "selected" and outcome.get("optionId") == "allow"
        return False

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
            cwds[session] = params.get("cwd")
            send({"jsonrpc": "2.0", "id": rid, "result": {"sessionId": session} if method == "session/new" else {}})
        elif method == "session/set_mode":
            send({"jsonrpc": "2.0", "id": rid, "result": {}})
        elif method == "session/prompt":
            session = params.get("sessionId")
            given = servers.get(session, [])
            text = f"{len(given)} MCP servers" + (": " + ",".join(s.get("name", "?") for s in given) if given else "")
            if args.ask:
                if ask(session):
                    subprocess.run(args.ask, shell=True, cwd=cwds.get(session), check=False)
                    text = f"ran: {args.ask}"
                else:
                    text = f"refused: {args.ask}"
            update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}
            send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": session, "update": update}})
            send({"jsonrpc": "2.0", "id": rid, "result": {"stopReason": "end_turn"}})
        elif rid is not None:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"method not found: {method}"}})


if __name__ == "__main__":
    main()
