// Package imagetest helps tests of images: it makes the packages they
// install, so that no package index is needed.
package imagetest

import (
	"archive/zip"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// WriteWheel writes a minimal pure-Python wheel by hand, to the wheel
// spec (PEP 427): the module, METADATA, WHEEL and a RECORD with each
// file's sha256.
func WriteWheel(t *testing.T, dir, name, version, module string) string {
	t.Helper()
	distInfo := fmt.Sprintf("%s-%s.dist-info", name, version)
	files := []struct{ path, content string }{
		{name + "/__init__.py", module},
		{distInfo + "/METADATA", fmt.Sprintf("Metadata-Version: 2.1\nName: %s\nVersion: %s\n", name, version)},
		{distInfo + "/WHEEL", "Wheel-Version: 1.0\nGenerator: vertal-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	path := filepath.Join(dir, fmt.Sprintf("%s-%s-py3-none-any.whl", name, version))
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	zw := zip.NewWriter(f)
	var record strings.Builder
	for _, file := range files {
		w, err := zw.Create(file.path)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(file.content))
		sum := sha256.Sum256([]byte(file.content))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", file.path, base64.RawURLEncoding.EncodeToString(sum[:]), len(file.content))
	}
	record.WriteString(distInfo + "/RECORD,,\n")
	w, _ := zw.Create(distInfo + "/RECORD")
	w.Write([]byte(record.String()))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	return path
}
