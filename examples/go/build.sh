#!/usr/bin/env bash
# Build the Go example in GOPATH mode from Debian's packages (no module proxy needed):
# golang-go, golang-google-grpc-dev, golang-google-protobuf-dev, protobuf-compiler,
# protoc-gen-go, protoc-gen-go-grpc (scripts/setup.sh test installs them).
#
#   examples/go/build.sh [OUT]      OUT: default examples/go/build; the binary is OUT/stockade-example
#
# The Go code for proto/stockade/v1 is generated into OUT/gopath/src/stockade/v1 (import path
# "stockade/v1", package stockadev1) on every build, so it always matches the .proto files. The
# .proto files carry no go_package option: the M flags below give the import path instead.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
proto=$(cd "$here/../../proto" && pwd)
out=${1:-$here/build}
mkdir -p "$out"
out=$(cd "$out" && pwd)
gopath=$out/gopath
gen=$gopath/src/stockade/v1

for tool in go protoc protoc-gen-go protoc-gen-go-grpc; do
    command -v "$tool" >/dev/null || { echo "build.sh: $tool not found (scripts/setup.sh test installs it)" >&2; exit 1; }
done

rm -rf "$gen"
mkdir -p "$gen"
files=()
go_opts=()
grpc_opts=()
for path in "$proto"/stockade/v1/*.proto; do
    name=stockade/v1/$(basename "$path")
    files+=("$name")
    go_opts+=("--go_opt=M$name=stockade/v1;stockadev1")
    grpc_opts+=("--go-grpc_opt=M$name=stockade/v1;stockadev1")
done
protoc -I"$proto" -I/usr/include \
    --go_out="$gopath/src" --go_opt=paths=import "${go_opts[@]}" \
    --go-grpc_out="$gopath/src" --go-grpc_opt=paths=import "${grpc_opts[@]}" \
    "${files[@]}"

cd "$here"
# go needs a build cache; without HOME (some CI shells) it has no default for one.
[ -n "${GOCACHE:-}" ] || [ -n "${HOME:-}" ] || export GOCACHE=/var/tmp/stockade-go-cache
GO111MODULE=off GOPATH="$gopath:/usr/share/gocode" GOFLAGS= \
    go build -o "$out/stockade-example" main.go
echo "$out/stockade-example"
