// Unmodified E2B JavaScript SDK code (`e2b` from npm) run against Stockade's E2B front: what
// code written for E2B does, with nothing Stockade-specific but the three environment variables
// that point the SDK at the supervisor:
//
//   E2B_API_URL=http://127.0.0.1:3000 E2B_SANDBOX_URL=http://127.0.0.1:3000 \
//   E2B_API_KEY=<a Stockade token> node dist/main.js
//
// Creates a sandbox with metadata and env vars, runs a command whose output streams through
// onStdout and onStderr, one that fails (CommandExitError), writes a text file and a binary one
// and reads them back, watches a folder while a command makes a file in it and files.write
// replaces another, answers a prompt that has no line end once it arrives, reads what `cat`
// echoes of one write as one chunk, forks the sandbox twice and reads a file in each fork,
// lists the sandboxes of its metadata, and kills the sandbox, printing one JSON object a line:
//   {"sandbox": ID}
//   {"run": {exitCode, stdout, stderr}, "chunks": {stdout: [...], stderr: [...]}}
//   {"failed": {exitCode, stdout, stderr, error}}
//   {"files": {text, binaryBytes, binarySame}}
//   {"watched": [{name, type}, ...]}
//   {"prompt": {beforeAnswer, stdout}}
//   {"echoed": FIRST_CHUNK}
//   {"forked": [{id, text}, ...]}
//   {"listed": [ID, ...]}
//   {"killed": true}
// Exits 1 on any error, with `error: NAME: message` on stderr.
import { CommandExitError, Sandbox } from "e2b";

function print(value: unknown): void {
  console.log(JSON.stringify(value));
}

async function main(): Promise<void> {
  const tag = `ts-${process.pid}`;
  const sbx = await Sandbox.create({
    metadata: { example: tag },
    envs: { GREETING: "hello from create" },
    timeoutMs: 120_000,
  });
  try {
    print({ sandbox: sbx.sandboxId });

    const chunks = { stdout: [] as string[], stderr: [] as string[] };
    const run = await sbx.commands.run(
      'echo "$GREETING $CALLER"; echo to-stderr >&2; sleep 0.3; echo after-sleep',
      {
        envs: { CALLER: "js" },
        onStdout: (data) => void chunks.stdout.push(data),
        onStderr: (data) => void chunks.stderr.push(data),
      },
    );
    print({ run: { exitCode: run.exitCode, stdout: run.stdout, stderr: run.stderr }, chunks });

    try {
      await sbx.commands.run("echo partial; exit 3");
      throw new Error("a command that exits 3 did not throw");
    } catch (err) {
      if (!(err instanceof CommandExitError)) throw err;
      print({
        failed: { exitCode: err.exitCode, stdout: err.stdout, stderr: err.stderr, error: err.error },
      });
    }

    await sbx.files.write("/home/user/notes/hello.txt", "written by the e2b JS SDK\n");
    const binary = new Uint8Array(256 * 1024).map((_, i) => (i * 7) % 256);
    await sbx.files.write("data.bin", binary.buffer);
    const text = await sbx.files.read("/home/user/notes/hello.txt");
    const back = await sbx.files.read("data.bin", { format: "bytes" });
    const same = back.length === binary.length && back.every((b, i) => b === binary[i]);
    print({ files: { text, binaryBytes: back.length, binarySame: same } });

    await sbx.files.makeDir("/home/user/watched");
    await sbx.files.write("/home/user/watched/old.txt", "before");
    const seen: { name: string; type: string }[] = [];
    const watch = await sbx.files.watchDir("/home/user/watched", (event) => {
      seen.push({ name: event.name, type: String(event.type) });
    });
    await sbx.commands.run("echo made > /home/user/watched/new.txt");
    await sbx.files.write("/home/user/watched/old.txt", "after"); // envd's WRITE, as in place
    const done = () => seen.some((e) => e.name === "old.txt" && String(e.type) === "write");
    for (let waited = 0; !done() && waited < 10_000; waited += 50) {
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    await watch.stop();
    print({ watched: seen });

    // A prompt without a line end reaches onStdout while its command waits for the answer:
    // the answer is sent only once the prompt has arrived (held back, this would never end).
    const prompted: string[] = [];
    let promptArrived = (): void => undefined;
    const arrived = new Promise<void>((resolve) => (promptArrived = resolve));
    const asking = await sbx.commands.run('printf "name? "; read -r name; echo "hi $name"', {
      background: true,
      stdin: true,
      onStdout: (data) => {
        prompted.push(data);
        if (prompted.join("").includes("name? ")) promptArrived();
      },
    });
    await arrived;
    const before = prompted.join("");
    await asking.sendStdin("js\n");
    const answered = await asking.wait();
    print({ prompt: { beforeAnswer: before, stdout: answered.stdout } });

    // One write of the process is one chunk: `cat` echoes a line and an open end together.
    let echoed = (_: string): void => undefined;
    const first = new Promise<string>((resolve) => (echoed = resolve));
    const echo = await sbx.commands.run("cat", {
      background: true,
      stdin: true,
      onStdout: (data) => echoed(data),
    });
    await echo.sendStdin("Hello,\nWorld!");
    print({ echoed: await first });
    await echo.kill();

    // A fork of the sandbox with the files it had: two sandboxes, each its own.
    await sbx.files.write("/home/user/forked.txt", "from the source");
    const forks = await sbx.fork({ count: 2, timeoutMs: 60_000 });
    const forked: { id: string; text: string }[] = [];
    for (const fork of forks) {
      if (fork instanceof Error) throw fork;
      forked.push({ id: fork.sandboxId, text: await fork.files.read("/home/user/forked.txt") });
      await fork.kill();
    }
    print({ forked });

    const paginator = Sandbox.list({ query: { metadata: { example: tag } } });
    const listed = (await paginator.nextItems()).map((s) => s.sandboxId);
    print({ listed });
  } finally {
    print({ killed: await sbx.kill() });
  }
}

main().catch((err: unknown) => {
  const name = err instanceof Error ? err.name : "Error";
  console.error(`error: ${name}: ${err instanceof Error ? err.message : String(err)}`);
  process.exitCode = 1;
});
