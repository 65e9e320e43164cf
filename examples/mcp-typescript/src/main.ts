// An MCP client of Stockade's MCP endpoint in TypeScript: the official MCP SDK
// (@modelcontextprotocol/sdk) over streamable HTTP, with a bearer token. No Stockade code and
// no .proto files: what any MCP client does with the endpoint.
//
//   STOCKADE_TOKEN=... node dist/main.js URL [PATH]
//
// URL: the endpoint, e.g. http://127.0.0.1:50052/mcp. The token (a line of the supervisor's
// [auth] tokens_file) comes from $STOCKADE_TOKEN, not from the command line, where other users
// could read it; unset or empty: no Authorization header (a supervisor with auth off).
// Lists the tools, runs `echo hi` with exec, writes PATH (default notes/hello.txt) with
// write_file and reads it back with read_file, printing one JSON object a line:
//   {"session": ID, "server": {name, version}, "protocol": VERSION}
//   {"tools": [NAME, ...]}
//   {"tool": NAME, "arguments": {...}, "result": CallToolResult}   (one per call)
// then ends the session. Exits 1 on any error, with `error: ...` on stderr: a refused HTTP
// request (`error: HTTP 401: ...` for a missing or wrong token), an unreachable endpoint, or a
// tool result with isError.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport, StreamableHTTPError } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import type { CallToolResult, Tool } from "@modelcontextprotocol/sdk/types.js";

const CLIENT_NAME = "stockade-example-mcp-typescript";
// The first call creates the sandbox's container: allow more than the SDK's 60 s default.
const REQUEST_OPTIONS = { timeout: 120_000 };

/** A tool call that ran and failed: its text says why (`Error (CODE): message`). */
class ToolFailed extends Error {
  constructor(tool: string, result: CallToolResult) {
    const text = result.content.map((c) => (c.type === "text" ? c.text : `[${c.type}]`)).join("");
    super(`${tool} failed: ${text}`);
  }
}

function print(value: unknown): void {
  console.log(JSON.stringify(value));
}

function describe(err: unknown): string {
  if (err instanceof StreamableHTTPError && err.code !== undefined && err.code > 0) {
    return `HTTP ${err.code}: ${err.message}`;
  }
  return err instanceof Error ? err.message : String(err);
}

function fail(err: unknown): void {
  console.error(`error: ${describe(err)}`);
  process.exitCode = 1;
}

async function listTools(client: Client): Promise<Tool[]> {
  const tools: Tool[] = [];
  let cursor: string | undefined;
  do {
    const page = await client.listTools(cursor === undefined ? {} : { cursor }, REQUEST_OPTIONS);
    tools.push(...page.tools);
    cursor = page.nextCursor;
  } while (cursor !== undefined);
  return tools;
}

/** tools/call; the result is printed, and a result with isError thrown as ToolFailed. */
async function call(client: Client, tool: string, args: Record<string, unknown>): Promise<CallToolResult> {
  const result = (await client.callTool({ name: tool, arguments: args }, undefined, REQUEST_OPTIONS)) as CallToolResult;
  print({ tool, arguments: args, result });
  if (result.isError) {
    throw new ToolFailed(tool, result);
  }
  return result;
}

async function run(url: URL, path: string, token: string | undefined): Promise<void> {
  const headers: Record<string, string> = token ? { Authorization: `Bearer ${token}` } : {};
  const transport = new StreamableHTTPClientTransport(url, { requestInit: { headers } });
  const client = new Client({ name: CLIENT_NAME, version: "0.1.0" });
  await client.connect(transport, REQUEST_OPTIONS);
  try {
    print({ session: transport.sessionId ?? null, server: client.getServerVersion(), protocol: transport.protocolVersion ?? null });
    print({ tools: (await listTools(client)).map((t) => t.name) });
    await call(client, "exec", { command: "echo hi" });
    await call(client, "write_file", { path, content: `written by ${CLIENT_NAME}\n` });
    await call(client, "read_file", { path });
  } finally {
    // Ends the MCP session (HTTP DELETE) also after a failed call; reported rather than
    // thrown, so that it cannot hide the error that got us here.
    await transport.terminateSession().catch(fail);
    await client.close();
  }
}

const args = process.argv.slice(2);
if (args.length < 1 || args.length > 2) {
  console.error("usage: STOCKADE_TOKEN=... node dist/main.js URL [PATH]");
  process.exit(2);
}
let url: URL;
try {
  url = new URL(args[0]);
} catch {
  console.error(`error: not a URL: ${args[0]}`);
  process.exit(2);
}
run(url, args[1] ?? "notes/hello.txt", process.env.STOCKADE_TOKEN).catch(fail);
