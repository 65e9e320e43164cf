// A Stockade client in Go, on the code protoc generates from proto/stockade/v1 (build.sh).
//
//	stockade-example [ADDR [KEY]]    ADDR: host:port, default $STOCKADE_ADDR or 127.0.0.1:50051
//
// Creates the sandbox KEY (default "example-go"), runs a command, streams another, writes a
// file and reads it back, then destroys the sandbox with its workspace. Exits 1 on any error:
// a gRPC status (wrong request, supervisor down) or a tool result with is_error.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	stockadev1 "stockade/v1"
)

const (
	agentID     = "example-go"
	callTimeout = 120 * time.Second
	// exec may return up to 10 MiB per stream: raise grpc-go's 4 MiB receive limit.
	maxReceiveBytes = 64 << 20
)

// toolFailed is a tool call that ran and failed: the result says why.
type toolFailed struct {
	tool   string
	result *stockadev1.ToolResult
}

func (e *toolFailed) Error() string {
	return fmt.Sprintf("%s failed: %s: %s", e.tool, e.result.ErrorCode, e.result.ErrorMessage)
}

// rpcError names the method, the status and the supervisor's stable reason (trailer
// stockade-error-reason).
func rpcError(method string, err error, trailer metadata.MD) error {
	st := status.Convert(err)
	msg := fmt.Sprintf("%s: %s: %s", method, st.Code(), st.Message())
	if reason := trailer.Get("stockade-error-reason"); len(reason) > 0 {
		msg += " (" + reason[0] + ")"
	}
	return errors.New(msg)
}

type sandbox struct {
	tools stockadev1.ToolServiceClient
	key   string
}

func (s *sandbox) request(tool string, args interface{}) (*stockadev1.CallToolRequest, error) {
	encoded, err := json.Marshal(args)
	if err != nil {
		return nil, err
	}
	return &stockadev1.CallToolRequest{
		SandboxKey:    s.key,
		Tool:          tool,
		ArgumentsJson: string(encoded),
		Context:       &stockadev1.CallContext{AgentId: agentID},
	}, nil
}

// call runs CallTool; a result with is_error is returned as a *toolFailed, data_json parsed.
func (s *sandbox) call(tool string, args interface{}) (map[string]interface{}, error) {
	req, err := s.request(tool, args)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	var trailer metadata.MD
	result, err := s.tools.CallTool(ctx, req, grpc.Trailer(&trailer))
	if err != nil {
		return nil, rpcError("CallTool", err, trailer)
	}
	return parseResult(tool, result)
}

// stream runs CallToolStream: output chunks are written to out as the command produces
// them; the final result comes last.
func (s *sandbox) stream(tool string, args interface{}, out io.Writer) (map[string]interface{}, error) {
	req, err := s.request(tool, args)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel() // also cancels the command if we return early
	events, err := s.tools.CallToolStream(ctx, req)
	if err != nil {
		return nil, rpcError("CallToolStream", err, nil)
	}
	for {
		event, err := events.Recv()
		if err == io.EOF {
			return nil, errors.New("CallToolStream: the stream ended without a result")
		}
		if err != nil {
			return nil, rpcError("CallToolStream", err, events.Trailer())
		}
		switch e := event.Event.(type) {
		case *stockadev1.ToolEvent_Output:
			if _, err := io.WriteString(out, e.Output.Text); err != nil {
				return nil, err
			}
		case *stockadev1.ToolEvent_Result:
			return parseResult(tool, e.Result)
		}
	}
}

func parseResult(tool string, result *stockadev1.ToolResult) (map[string]interface{}, error) {
	if result.IsError {
		return nil, &toolFailed{tool, result}
	}
	data := map[string]interface{}{}
	if result.DataJson != "" {
		if err := json.Unmarshal([]byte(result.DataJson), &data); err != nil {
			return nil, fmt.Errorf("%s: data_json: %w", tool, err)
		}
	}
	return data, nil
}

func run(address, key string) (err error) {
	// Plaintext, as the supervisor serves (grpc-go 1.33 predates credentials/insecure).
	conn, err := grpc.Dial(address, grpc.WithInsecure(),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxReceiveBytes)))
	if err != nil {
		return err
	}
	defer conn.Close()
	sandboxes := stockadev1.NewSandboxServiceClient(conn)

	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	var trailer metadata.MD
	info, err := sandboxes.EnsureSandbox(ctx, &stockadev1.EnsureSandboxRequest{Key: key}, grpc.Trailer(&trailer))
	if err != nil {
		return rpcError("EnsureSandbox", err, trailer)
	}
	containerID := info.ContainerId
	if len(containerID) > 12 {
		containerID = containerID[:12]
	}
	fmt.Printf("sandbox %s: %s on %s (container %s)\n", info.Key, info.State, info.Engine, containerID)
	defer func() {
		// Reported here rather than returned when an earlier error is on its way out, so
		// that it cannot hide that one.
		if destroyErr := destroy(sandboxes, key); destroyErr != nil {
			if err == nil {
				err = destroyErr
			} else {
				fmt.Fprintf(os.Stderr, "error: %v\n", destroyErr)
			}
		}
	}()
	return useSandbox(&sandbox{stockadev1.NewToolServiceClient(conn), key})
}

func destroy(sandboxes stockadev1.SandboxServiceClient, key string) error {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	var trailer metadata.MD
	gone, err := sandboxes.DestroySandbox(ctx,
		&stockadev1.DestroySandboxRequest{Key: key, DeleteWorkspace: true}, grpc.Trailer(&trailer))
	if err != nil {
		return rpcError("DestroySandbox", err, trailer)
	}
	fmt.Printf("destroyed: container removed %t, workspace deleted %t\n", gone.Removed, gone.WorkspaceDeleted)
	return nil
}

func useSandbox(box *sandbox) error {
	command := "echo hello from $(uname -n); uname -sm"
	executed, err := box.call("exec", map[string]interface{}{"command": command})
	if err != nil {
		return err
	}
	fmt.Printf("$ %s\n%sexit code %v\n", command, executed["stdout"], executed["exit_code"])

	fmt.Println("streamed:")
	streamed, err := box.stream("exec",
		map[string]interface{}{"command": "for i in 1 2 3; do echo tick $i; done"}, os.Stdout)
	if err != nil {
		return err
	}
	fmt.Printf("exit code %v\n", streamed["exit_code"])

	content := fmt.Sprintf("written by %s into %s\n", agentID, box.key)
	written, err := box.call("write_file", map[string]interface{}{"path": "notes/hello.txt", "content": content})
	if err != nil {
		return err
	}
	fmt.Printf("wrote notes/hello.txt: %v bytes\n", written["bytes_written"])
	read, err := box.call("read_file", map[string]interface{}{"path": "notes/hello.txt"})
	if err != nil {
		return err
	}
	fmt.Printf("read notes/hello.txt: %v", read["content"])
	return nil
}

func main() {
	address := os.Getenv("STOCKADE_ADDR")
	if address == "" {
		address = "127.0.0.1:50051"
	}
	key := "example-go"
	args := os.Args[1:]
	if len(args) > 2 {
		fmt.Fprintln(os.Stderr, "usage: stockade-example [ADDR [KEY]]")
		os.Exit(2)
	}
	if len(args) > 0 {
		address = args[0]
	}
	if len(args) > 1 {
		key = args[1]
	}
	if err := run(address, key); err != nil {
		fmt.Fprintf(os.Stderr, "error: %v\n", err)
		os.Exit(1)
	}
}
