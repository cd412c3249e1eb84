package sqlstore

import (
	"encoding/json"
	"fmt"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// storedFile is store.File in the column marshalFiles writes.
type storedFile struct {
	Path    string `json:"path"`
	Content []byte `json:"content"`
}

// marshalFiles is how an execution's files are kept in one column: JSON
// (contents in base64), nil when there are none.
func marshalFiles(files []store.File) ([]byte, error) {
	if len(files) == 0 {
		return nil, nil
	}
	out := make([]storedFile, len(files))
	for i, f := range files {
		out[i] = storedFile(f)
	}
	return json.Marshal(out)
}

// unmarshalFiles reads what marshalFiles wrote (nil or empty: none).
func unmarshalFiles(b []byte) ([]store.File, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var in []storedFile
	if err := json.Unmarshal(b, &in); err != nil {
		return nil, fmt.Errorf("decoding stored files: %w", err)
	}
	files := make([]store.File, len(in))
	for i, f := range in {
		files[i] = store.File(f)
	}
	return files, nil
}
