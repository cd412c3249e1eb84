package api

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"net/http"
)

// openAPISpec is the hand-written OpenAPI 3.1 document. The conformance
// test checks every answer the server gives against it.
//
//go:embed openapi.json
var openAPISpec []byte

// OpenAPIDocument returns the document as the server publishes it under
// mount prefix ("" or "/api") for version, for the documentation pages,
// which are built before the server.
func OpenAPIDocument(version, prefix string) ([]byte, error) {
	docs, err := openAPIDocuments(version)
	if err != nil {
		return nil, err
	}
	doc, ok := docs[prefix]
	if !ok {
		return nil, fmt.Errorf("api: no OpenAPI document for mount %q", prefix)
	}
	return doc, nil
}

// openAPIDocuments renders the document for each mount: its server URL is
// the mount prefix, so relative requests from a client that loaded
// /api/v1/openapi.json go to /api/v1/....
func openAPIDocuments(version string) (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, prefix := range []string{"", "/api"} {
		var doc map[string]any
		if err := json.Unmarshal(openAPISpec, &doc); err != nil {
			return nil, fmt.Errorf("api: embedded openapi.json: %w", err)
		}
		url := prefix
		if url == "" {
			url = "/"
		}
		doc["servers"] = []any{map[string]any{"url": url}}
		if version != "" {
			doc["info"].(map[string]any)["version"] = version
		}
		b, err := json.MarshalIndent(doc, "", "  ")
		if err != nil {
			return nil, err
		}
		out[prefix] = append(b, '\n')
	}
	return out, nil
}

func (s *Server) getOpenAPI(prefix string) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Cache-Control", "public, max-age=300")
		w.Header().Set("Access-Control-Allow-Origin", "*")
		var raw json.RawMessage = s.openapi[prefix]
		return s.writeJSON(w, r, http.StatusOK, raw)
	}
}
