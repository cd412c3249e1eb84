package mcpserver

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// returnedFile is one entry of an execution's "files" (docs/API.md).
type returnedFile struct {
	Path     string `json:"path"`
	Size     int64  `json:"size"`
	Encoding string `json:"encoding"`
	Content  string `json:"content"`
}

// returnedFiles reads the files of an execution object as the API sends
// it. The client package's types are not needed for this: the raw body
// is the wire format.
func returnedFiles(raw json.RawMessage) ([]returnedFile, bool, error) {
	var body struct {
		Files          []returnedFile `json:"files"`
		FilesTruncated bool           `json:"files_truncated"`
	}
	if err := json.Unmarshal(raw, &body); err != nil {
		return nil, false, fmt.Errorf("decoding returned files: %w", err)
	}
	return body.Files, body.FilesTruncated, nil
}

// bytes is the file's content, decoded.
func (f returnedFile) bytes() ([]byte, error) {
	if f.Encoding == "" || f.Encoding == "utf8" {
		return []byte(f.Content), nil
	}
	if f.Encoding != "base64" {
		return nil, fmt.Errorf("returned file %q: unknown encoding %q", f.Path, f.Encoding)
	}
	b, err := base64.StdEncoding.DecodeString(f.Content)
	if err != nil {
		return nil, fmt.Errorf("returned file %q: %w", f.Path, err)
	}
	return b, nil
}

// rasterImages are the image types an MCP client can show, by the MIME
// type http.DetectContentType gives them. SVG is not one of them: it is
// markup (and can carry script), so it comes back as a text resource.
var rasterImages = map[string]bool{"image/png": true, "image/jpeg": true, "image/gif": true, "image/webp": true}

// fileURI names a returned file as an MCP resource.
func fileURI(executionID, path string) string {
	parts := strings.Split(path, "/")
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	return "vertal://executions/" + url.PathEscape(executionID) + "/files/" + strings.Join(parts, "/")
}

// fileContent is a returned file as MCP content. The type is sniffed from
// the bytes, never taken from the name: a program names its files as it
// likes. Raster images become image content; anything else an embedded
// resource, as text when it is valid UTF-8 and as a blob otherwise.
func fileContent(executionID string, f returnedFile) (mcp.Content, error) {
	data, err := f.bytes()
	if err != nil {
		return nil, err
	}
	sniffed := http.DetectContentType(data)
	if rasterImages[sniffed] {
		return &mcp.ImageContent{Data: data, MIMEType: sniffed}, nil
	}
	res := &mcp.ResourceContents{URI: fileURI(executionID, f.Path)}
	if utf8.Valid(data) {
		res.MIMEType = sniffed
		if !strings.HasPrefix(sniffed, "text/") {
			res.MIMEType = "text/plain; charset=utf-8"
		}
		res.Text = string(data)
	} else {
		res.MIMEType = sniffed
		res.Blob = data
	}
	return &mcp.EmbeddedResource{Resource: res}, nil
}

// filesLine names the returned files for the text a model reads.
func filesLine(files []returnedFile, truncated bool) string {
	if len(files) == 0 && !truncated {
		return ""
	}
	names := make([]string, len(files))
	for i, f := range files {
		names[i] = fmt.Sprintf("%s (%d bytes)", f.Path, f.Size)
	}
	line := "files: (none)"
	if len(names) > 0 {
		line = "files: " + strings.Join(names, ", ")
	}
	if truncated {
		line += "; files_truncated: true (the plan's caps on count or size left some matching files out)"
	}
	return line + "\n"
}

// withoutFileContent is the structured result with the files' content
// left out: it is already in the tool result's content, once.
func withoutFileContent(structured map[string]any) {
	files, ok := structured["files"].([]any)
	if !ok {
		return
	}
	for _, f := range files {
		if m, ok := f.(map[string]any); ok {
			delete(m, "content")
			delete(m, "encoding")
		}
	}
}
