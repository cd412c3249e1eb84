#!/usr/bin/env bash
# Regenerates the Go + Connect code for the envd-compatible protos in this
# directory (process/process.proto, filesystem/filesystem.proto).
#
# Pinned toolchain (the checked-in *.pb.go files were produced with these):
#   protoc                3.21.12  (Debian bookworm: apt-get install -y protobuf-compiler)
#   protoc-gen-go         v1.36.12 (go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12)
#   protoc-gen-connect-go v1.19.1  (go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.19.1)
#
# The plugins are looked up in $GOBIN (if set), then $(go env GOPATH)/bin,
# then $PATH. Example:
#   GOBIN=/tmp/protobin go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
#   GOBIN=/tmp/protobin go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.19.1
#   GOBIN=/tmp/protobin ./internal/e2b/envdpb/generate.sh
#
# google/protobuf/timestamp.proto comes with protoc's include directory
# (/usr/include on Debian); set PROTOC_INCLUDE to override.
set -euo pipefail

cd "$(dirname "$0")"

for d in "${GOBIN:-}" "$(go env GOPATH)/bin"; do
  if [[ -n "$d" && -d "$d" ]]; then
    PATH="$d:$PATH"
  fi
done
export PATH

for tool in protoc protoc-gen-go protoc-gen-connect-go; do
  command -v "$tool" >/dev/null || { echo "generate.sh: $tool not found (see header)" >&2; exit 1; }
done

include_args=(-I .)
if [[ -n "${PROTOC_INCLUDE:-}" ]]; then
  include_args+=(-I "$PROTOC_INCLUDE")
fi

protoc "${include_args[@]}" \
  --go_out=. --go_opt=paths=source_relative \
  --connect-go_out=. --connect-go_opt=paths=source_relative \
  process/process.proto filesystem/filesystem.proto
