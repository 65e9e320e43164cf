// A Stockade client in TypeScript: @grpc/grpc-js with the .proto files loaded at run time
// (no protoc), typed by proto-loader-gen-types (`npm run gen`, part of `npm run build`).
//
//   node dist/main.js [ADDR [KEY]]     ADDR: host:port, default $STOCKADE_ADDR or 127.0.0.1:50051
//
// Creates the sandbox KEY (default "example-typescript"), runs a command, streams another,
// writes a file and reads it back, then destroys the sandbox with its workspace. Exits 1 on
// any error: a gRPC status (wrong request, supervisor down) or a tool result with is_error.
import * as path from "node:path";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import type { ProtoGrpcType as SandboxProto } from "./gen/sandbox";
import type { ProtoGrpcType as ToolProto } from "./gen/tool";
import type { SandboxServiceClient } from "./gen/stockade/v1/SandboxService";
import type { ToolServiceClient } from "./gen/stockade/v1/ToolService";
import type { CallToolRequest } from "./gen/stockade/v1/CallToolRequest";
import type { ToolResult__Output } from "./gen/stockade/v1/ToolResult";
import type { SandboxInfo__Output } from "./gen/stockade/v1/SandboxInfo";
import type { DestroySandboxResponse__Output } from "./gen/stockade/v1/DestroySandboxResponse";

const PROTO_DIR = process.env.STOCKADE_PROTO_DIR ?? path.resolve(__dirname, "../../../proto");
const AGENT_ID = "example-typescript";
// exec may return up to 10 MiB per stream: raise grpc-js's 4 MiB receive limit.
const CHANNEL_OPTIONS = { "grpc.max_receive_message_length": 64 * 1024 * 1024 };
const CALL_TIMEOUT_MS = 120_000;

/** A tool call that ran and failed: the result says why (error_code, error_message). */
class ToolFailed extends Error {
  constructor(tool: string, result: ToolResult__Output) {
    super(`${tool} failed: ${result.error_code}: ${result.error_message}`);
  }
}

/** The same options as proto-loader-gen-types was given, so the generated types hold. */
function loadProtos(): SandboxProto & ToolProto {
  const definition = protoLoader.loadSync(["stockade/v1/sandbox.proto", "stockade/v1/tool.proto"], {
    includeDirs: [PROTO_DIR],
    keepCase: true,
    longs: String,
    enums: String,
    defaults: true,
    oneofs: true,
  });
  return grpc.loadPackageDefinition(definition) as unknown as SandboxProto & ToolProto;
}

function deadline(): grpc.CallOptions {
  return { deadline: Date.now() + CALL_TIMEOUT_MS };
}

/** A unary call as a promise; a gRPC status becomes an Error naming the method, the status
 * and the supervisor's stable reason (trailer stockade-error-reason). */
function unary<Res>(name: string, start: (callback: grpc.requestCallback<Res>) => void): Promise<Res> {
  return new Promise((resolve, reject) => {
    start((err, reply) => {
      if (err) {
        reject(new Error(`${name}: ${describeStatus(err)}`));
      } else if (reply === undefined) {
        reject(new Error(`${name}: empty reply`));
      } else {
        resolve(reply);
      }
    });
  });
}

function describeStatus(err: grpc.ServiceError): string {
  const reason = err.metadata?.get("stockade-error-reason")[0];
  return `${grpc.status[err.code]}: ${err.details}` + (reason ? ` (${reason})` : "");
}

function fail(err: unknown): void {
  console.error(`error: ${err instanceof Error ? err.message : String(err)}`);
  process.exitCode = 1;
}

class Sandbox {
  constructor(
    private readonly tools: ToolServiceClient,
    readonly key: string,
  ) {}

  private request(tool: string, args: object): CallToolRequest {
    return {
      sandbox_key: this.key,
      tool,
      arguments_json: JSON.stringify(args),
      context: { agent_id: AGENT_ID },
    };
  }

  /** CallTool; a result with is_error is thrown as ToolFailed. `data_json` is parsed. */
  async call(tool: string, args: object): Promise<Record<string, unknown>> {
    const result = await unary<ToolResult__Output>("CallTool", (done) =>
      this.tools.CallTool(this.request(tool, args), deadline(), done),
    );
    if (result.is_error) {
      throw new ToolFailed(tool, result);
    }
    return result.data_json ? JSON.parse(result.data_json) : {};
  }

  /** CallToolStream: output chunks go to `onOutput` as the command produces them; the
   * final ToolResult comes last. */
  stream(tool: string, args: object, onOutput: (stream: string, text: string) => void): Promise<ToolResult__Output> {
    return new Promise((resolve, reject) => {
      let result: ToolResult__Output | undefined;
      const call = this.tools.CallToolStream(this.request(tool, args), deadline());
      call.on("data", (event) => {
        if (event.output) {
          onOutput(event.output.stream, event.output.text);
        } else if (event.result) {
          result = event.result;
        }
      });
      call.on("error", (err: grpc.ServiceError) => reject(new Error(`CallToolStream: ${describeStatus(err)}`)));
      call.on("end", () => {
        if (result === undefined) {
          reject(new Error("CallToolStream: the stream ended without a result"));
        } else if (result.is_error) {
          reject(new ToolFailed(tool, result));
        } else {
          resolve(result);
        }
      });
    });
  }
}

async function run(address: string, key: string): Promise<void> {
  const protos = loadProtos();
  const credentials = grpc.credentials.createInsecure();
  const sandboxes: SandboxServiceClient = new protos.stockade.v1.SandboxService(address, credentials, CHANNEL_OPTIONS);
  const tools: ToolServiceClient = new protos.stockade.v1.ToolService(address, credentials, CHANNEL_OPTIONS);
  try {
    const info = await unary<SandboxInfo__Output>("EnsureSandbox", (done) =>
      sandboxes.EnsureSandbox({ key }, deadline(), done),
    );
    console.log(`sandbox ${info.key}: ${info.state} on ${info.engine} (container ${info.container_id.slice(0, 12)})`);
    try {
      await useSandbox(new Sandbox(tools, key));
    } finally {
      // Reported here rather than thrown, so that it cannot hide the error that got us here.
      await destroy(sandboxes, key).catch(fail);
    }
  } finally {
    sandboxes.close();
    tools.close();
  }
}

async function destroy(sandboxes: SandboxServiceClient, key: string): Promise<void> {
  const gone = await unary<DestroySandboxResponse__Output>("DestroySandbox", (done) =>
    sandboxes.DestroySandbox({ key, delete_workspace: true }, deadline(), done),
  );
  console.log(`destroyed: container removed ${gone.removed}, workspace deleted ${gone.workspace_deleted}`);
}

async function useSandbox(box: Sandbox): Promise<void> {
  const command = "echo hello from $(uname -n); uname -sm";
  const executed = await box.call("exec", { command });
  console.log(`$ ${command}`);
  process.stdout.write(String(executed.stdout));
  console.log(`exit code ${executed.exit_code}`);

  console.log("streamed:");
  const streamed = await box.stream("exec", { command: "for i in 1 2 3; do echo tick $i; done" }, (_stream, text) =>
    process.stdout.write(text),
  );
  console.log(`exit code ${JSON.parse(streamed.data_json).exit_code}`);

  const content = `written by ${AGENT_ID} into ${box.key}\n`;
  const written = await box.call("write_file", { path: "notes/hello.txt", content });
  console.log(`wrote notes/hello.txt: ${written.bytes_written} bytes`);
  const read = await box.call("read_file", { path: "notes/hello.txt" });
  process.stdout.write(`read notes/hello.txt: ${read.content}`);
}

const args = process.argv.slice(2);
if (args.length > 2) {
  console.error("usage: node dist/main.js [ADDR [KEY]]");
  process.exit(2);
}
const [address = process.env.STOCKADE_ADDR || "127.0.0.1:50051", key = "example-typescript"] = args;
run(address, key).catch(fail);
