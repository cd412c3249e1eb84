package execution

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

func freeCaller() Caller {
	return Caller{Key: store.Key{ID: "key_000000000001", Tenant: "t1", Plan: "free"}, Plan: config.DefaultPlans()["free"]}
}

func ptr[T any](v T) *T { return &v }

func baseInput() Input {
	return Input{Language: ptr("python"), Code: ptr("print(1)")}
}

// TestPrepareRefusals: every bad file, env, arg and glob is refused with
// the kind and a message naming the field and its index.
func TestPrepareRefusals(t *testing.T) {
	s := newTestService(t, 1)
	file := func(p string) InputFile { return InputFile{Path: p, Content: "x"} }
	many := func(n int, f func(i int) string) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = f(i)
		}
		return out
	}
	manyFiles := func(n int) []InputFile {
		var fs []InputFile
		for i := range n {
			fs = append(fs, file("f"+strings.Repeat("x", i)))
		}
		return fs
	}
	bigEnv := map[string]string{}
	for i := range 65 {
		bigEnv["V"+strings.Repeat("A", i)] = "1"
	}
	for _, tc := range []struct {
		name string
		in   func(*Input)
		kind Kind
		msg  string
	}{
		{"dotdot", func(in *Input) { in.Files = []InputFile{file("ok.txt"), file("../etc/passwd")} }, KindInvalidRequest, "files[1].path: must not contain . or .. components"},
		{"dotdot inside", func(in *Input) { in.Files = []InputFile{file("a/../../b")} }, KindInvalidRequest, "files[0].path: must not contain . or .."},
		{"dot", func(in *Input) { in.Files = []InputFile{file("./a")} }, KindInvalidRequest, "files[0].path: must not contain . or .."},
		{"absolute", func(in *Input) { in.Files = []InputFile{file("/etc/passwd")} }, KindInvalidRequest, "files[0].path: must be relative"},
		{"empty path", func(in *Input) { in.Files = []InputFile{file("")} }, KindInvalidRequest, "files[0].path: must not be empty"},
		{"empty component", func(in *Input) { in.Files = []InputFile{file("a//b")} }, KindInvalidRequest, "files[0].path: has an empty component"},
		{"trailing slash", func(in *Input) { in.Files = []InputFile{file("a/")} }, KindInvalidRequest, "files[0].path: has an empty component"},
		{"backslash", func(in *Input) { in.Files = []InputFile{file(`a\b`)} }, KindInvalidRequest, "files[0].path: must use /"},
		{"nul in path", func(in *Input) { in.Files = []InputFile{file("a\x00b")} }, KindInvalidRequest, "files[0].path: must not contain a NUL"},
		{"long component", func(in *Input) { in.Files = []InputFile{file(strings.Repeat("a", 256))} }, KindInvalidRequest, "files[0].path: has a component longer than 255"},
		{"long path", func(in *Input) { in.Files = []InputFile{file(strings.Repeat("abcdefgh/", 114) + "abc")} }, KindInvalidRequest, "files[0].path: is longer than 1024"},
		{"deep", func(in *Input) { in.Files = []InputFile{file(strings.Repeat("a/", 16) + "b")} }, KindInvalidRequest, "files[0].path: is more than 16 levels"},
		{"duplicate", func(in *Input) { in.Files = []InputFile{file("a.txt"), file("b"), file("a.txt")} }, KindInvalidRequest, `files[2].path: "a.txt" is also files[0].path`},
		{"file and dir", func(in *Input) { in.Files = []InputFile{file("a/b/c"), file("a/b")} }, KindInvalidRequest, `files[0].path: "a/b" is a file (files[1])`},
		{"code file", func(in *Input) { in.Files = []InputFile{file("main.py")} }, KindInvalidRequest, "files[0].path: main.py is the code file"},
		{"code file as a directory", func(in *Input) { in.Files = []InputFile{file("ok.txt"), file("main.py/x")} }, KindInvalidRequest, `files[1].path: "main.py" is the code file, so it cannot be a directory`},
		{"code file as a deeper directory", func(in *Input) { in.Files = []InputFile{file("main.py/a/b")} }, KindInvalidRequest, `files[0].path: "main.py" is the code file`},
		{"file as a directory, file first", func(in *Input) { in.Files = []InputFile{file("a"), file("a/b")} }, KindInvalidRequest, `files[1].path: "a" is a file (files[0])`},
		{"bad encoding", func(in *Input) { in.Files = []InputFile{{Path: "a", Content: "x", Encoding: "hex"}} }, KindInvalidRequest, `files[0].encoding: "hex" is not utf8 or base64`},
		{"bad base64", func(in *Input) {
			in.Files = []InputFile{file("a"), {Path: "b", Content: "not base64!", Encoding: "base64"}}
		}, KindInvalidRequest, "files[1].content: not valid standard base64"},
		{"base64 without padding", func(in *Input) { in.Files = []InputFile{{Path: "b", Content: "YQ", Encoding: "base64"}} }, KindInvalidRequest, "files[0].content: not valid standard base64"},
		{"too many files", func(in *Input) { in.Files = manyFiles(11) }, KindPayloadTooLarge, "files has 11 entries; plan free allows 10"},
		{"too large files", func(in *Input) {
			in.Files = []InputFile{{Path: "a", Content: strings.Repeat("x", 600<<10)}, {Path: "b", Content: base64.StdEncoding.EncodeToString(make([]byte, 500<<10)), Encoding: "base64"}}
		}, KindPayloadTooLarge, "files are 1126400 bytes in all; plan free allows 1048576 bytes"},
		{"env name", func(in *Input) { in.Env = map[string]string{"1BAD": "x"} }, KindInvalidRequest, `env["1BAD"]: a name must match`},
		{"env name dash", func(in *Input) { in.Env = map[string]string{"A-B": "x"} }, KindInvalidRequest, `env["A-B"]: a name must match`},
		{"env empty name", func(in *Input) { in.Env = map[string]string{"": "x"} }, KindInvalidRequest, `env[""]: a name must match`},
		{"env long name", func(in *Input) { in.Env = map[string]string{strings.Repeat("A", 129): "x"} }, KindInvalidRequest, "a name must match"},
		{"env PATH", func(in *Input) { in.Env = map[string]string{"PATH": "/evil"} }, KindInvalidRequest, `env["PATH"]: the name is reserved`},
		{"env HOME", func(in *Input) { in.Env = map[string]string{"HOME": "/"} }, KindInvalidRequest, `env["HOME"]: the name is reserved`},
		{"env LANG", func(in *Input) { in.Env = map[string]string{"LANG": "C"} }, KindInvalidRequest, `env["LANG"]: the name is reserved`},
		{"env NODE_OPTIONS", func(in *Input) { in.Env = map[string]string{"NODE_OPTIONS": "--require x"} }, KindInvalidRequest, `env["NODE_OPTIONS"]: the name is reserved`},
		{"env VERTAL_", func(in *Input) { in.Env = map[string]string{"VERTAL_KEY": "x"} }, KindInvalidRequest, `env["VERTAL_KEY"]: the name is reserved`},
		{"env LD_PRELOAD", func(in *Input) { in.Env = map[string]string{"LD_PRELOAD": "x"} }, KindInvalidRequest, `env["LD_PRELOAD"]: the name is reserved`},
		{"env LD_DEBUG_OUTPUT", func(in *Input) { in.Env = map[string]string{"LD_DEBUG_OUTPUT": "x"} }, KindInvalidRequest, `env["LD_DEBUG_OUTPUT"]: the name is reserved`},
		{"env LD_LIBRARY_PATH", func(in *Input) { in.Env = map[string]string{"LD_LIBRARY_PATH": "x"} }, KindInvalidRequest, `env["LD_LIBRARY_PATH"]: the name is reserved`},
		{"env GCONV_PATH", func(in *Input) { in.Env = map[string]string{"GCONV_PATH": "x"} }, KindInvalidRequest, `env["GCONV_PATH"]: the name is reserved`},
		{"env GLIBC_TUNABLES", func(in *Input) { in.Env = map[string]string{"GLIBC_TUNABLES": "x"} }, KindInvalidRequest, `env["GLIBC_TUNABLES"]: the name is reserved`},
		{"env MALLOC_ARENA_MAX", func(in *Input) { in.Env = map[string]string{"MALLOC_ARENA_MAX": "x"} }, KindInvalidRequest, `env["MALLOC_ARENA_MAX"]: the name is reserved`},
		{"env PYTHONSTARTUP", func(in *Input) { in.Env = map[string]string{"PYTHONSTARTUP": "x"} }, KindInvalidRequest, `env["PYTHONSTARTUP"]: the name is reserved`},
		{"env PYTHONPATH", func(in *Input) { in.Env = map[string]string{"PYTHONPATH": "x"} }, KindInvalidRequest, `env["PYTHONPATH"]: the name is reserved`},
		{"env PYTHONHOME", func(in *Input) { in.Env = map[string]string{"PYTHONHOME": "x"} }, KindInvalidRequest, `env["PYTHONHOME"]: the name is reserved`},
		{"env PYTHONINSPECT", func(in *Input) { in.Env = map[string]string{"PYTHONINSPECT": "x"} }, KindInvalidRequest, `env["PYTHONINSPECT"]: the name is reserved`},
		{"env NODE_PATH", func(in *Input) { in.Env = map[string]string{"NODE_PATH": "x"} }, KindInvalidRequest, `env["NODE_PATH"]: the name is reserved`},
		{"env BASH_ENV", func(in *Input) { in.Env = map[string]string{"BASH_ENV": "x"} }, KindInvalidRequest, `env["BASH_ENV"]: the name is reserved`},
		{"env ENV", func(in *Input) { in.Env = map[string]string{"ENV": "x"} }, KindInvalidRequest, `env["ENV"]: the name is reserved`},
		{"env BASH_FUNC_x", func(in *Input) { in.Env = map[string]string{"BASH_FUNC_x": "x"} }, KindInvalidRequest, `env["BASH_FUNC_x"]: the name is reserved`},
		{"env NUL value", func(in *Input) { in.Env = map[string]string{"A": "x\x00y"} }, KindInvalidRequest, `env["A"]: the value must not contain a NUL`},
		{"env too many", func(in *Input) { in.Env = bigEnv }, KindInvalidRequest, "env has 65 names; the limit is 64"},
		{"env too large", func(in *Input) { in.Env = map[string]string{"A": strings.Repeat("x", 32<<10)} }, KindInvalidRequest, "env is 32769 bytes"},
		{"args NUL", func(in *Input) { in.Args = []string{"a", "b\x00"} }, KindInvalidRequest, "args[1]: must not contain a NUL"},
		{"args too many", func(in *Input) { in.Args = many(65, func(int) string { return "a" }) }, KindInvalidRequest, "args has 65 entries; the limit is 64"},
		{"args too large", func(in *Input) { in.Args = []string{strings.Repeat("x", 20<<10), strings.Repeat("y", 20<<10)} }, KindInvalidRequest, "args are 40960 bytes in all"},
		{"glob bad", func(in *Input) { in.ReturnFiles = []string{"*.png", "out/[a-"} }, KindInvalidRequest, "return_files[1]: is not a valid glob"},
		{"glob unclosed brace", func(in *Input) { in.ReturnFiles = []string{"{a,b"} }, KindInvalidRequest, "return_files[0]: is not a valid glob"},
		{"glob absolute", func(in *Input) { in.ReturnFiles = []string{"/etc/*"} }, KindInvalidRequest, "return_files[0]: must be relative"},
		{"glob dotdot", func(in *Input) { in.ReturnFiles = []string{"out/../../*"} }, KindInvalidRequest, "return_files[0]: must not contain a .. component"},
		{"glob empty", func(in *Input) { in.ReturnFiles = []string{""} }, KindInvalidRequest, "return_files[0]: must not be empty"},
		{"glob long", func(in *Input) { in.ReturnFiles = []string{strings.Repeat("a", 257)} }, KindInvalidRequest, "return_files[0]: is longer than 256"},
		{"glob too many", func(in *Input) { in.ReturnFiles = many(21, func(int) string { return "*" }) }, KindInvalidRequest, "return_files has 21 globs; the limit is 20"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := baseInput()
			tc.in(&in)
			_, err := s.prepare(freeCaller(), in)
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("prepare = %v; want an *Error", err)
			}
			if e.Kind != tc.kind || !strings.Contains(e.Msg, tc.msg) {
				t.Errorf("prepare = kind %d %q; want kind %d containing %q", e.Kind, e.Msg, tc.kind, tc.msg)
			}
		})
	}
}

// TestPrepareSpec: good files, env, args and globs reach the Spec, with
// the plan's caps as the sandbox's limits.
func TestPrepareSpec(t *testing.T) {
	s := newTestService(t, 1)
	in := baseInput()
	in.Files = []InputFile{
		{Path: "data/in.csv", Content: "a,b\n1,2\n"},
		{Path: "img.bin", Content: base64.StdEncoding.EncodeToString([]byte{0, 1, 2, 255}), Encoding: "base64"},
		{Path: "ünï/çödé.txt", Content: "é", Encoding: "utf8"},
	}
	in.Env = map[string]string{"MODE": "fast", "_x1": ""}
	in.Args = []string{"--n", "3", ""}
	in.ReturnFiles = []string{"*.png", "out/**"}
	c := caller("t1", 4) // pro
	p, err := s.prepare(c, in)
	if err != nil {
		t.Fatal(err)
	}
	want := engine.Spec{
		Language: engine.Language{Name: "python", File: "main.py"},
		Code:     "print(1)",
		Timeout:  p.spec.Timeout,
		Files: []engine.File{
			{Path: "data/in.csv", Content: []byte("a,b\n1,2\n")},
			{Path: "img.bin", Content: []byte{0, 1, 2, 255}},
			{Path: "ünï/çödé.txt", Content: []byte("é")},
		},
		Env:         in.Env,
		Args:        in.Args,
		ReturnFiles: in.ReturnFiles,
		// Every limit set, here and only here: the plan's memory and
		// file caps, the engine's defaults for the rest.
		Limits: engine.Limits{MemoryBytes: 512 << 20, CPUs: 1, Pids: 64, FileSizeBytes: 1 << 20, TmpBytes: 16 << 20, OutputBytes: 64 << 10,
			WorkdirBytes: 10<<20 + 16<<20, ReturnFiles: 50, ReturnBytes: 10 << 20, Lifetime: p.spec.Timeout + engine.LifetimeGrace},
	}
	if diff := cmp.Diff(want, p.spec, cmp.Comparer(func(a, b func(engine.Stream, []byte)) bool { return true })); diff != "" {
		t.Errorf("spec (-want +got):\n%s", diff)
	}
}

// TestRequestHashCoversNewFields: each new field changes the hash; the
// same bytes sent as utf8 or base64 do not.
func TestRequestHashCoversNewFields(t *testing.T) {
	s := newTestService(t, 1)
	c := caller("t1", 4)
	hash := func(f func(*Input)) string {
		in := baseInput()
		f(&in)
		h, err := s.RequestHash(c, in)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	base := hash(func(*Input) {})
	seen := map[string]string{base: "base"}
	for name, f := range map[string]func(*Input){
		"files":        func(in *Input) { in.Files = []InputFile{{Path: "a", Content: "x"}} },
		"files path":   func(in *Input) { in.Files = []InputFile{{Path: "b", Content: "x"}} },
		"env":          func(in *Input) { in.Env = map[string]string{"A": "1"} },
		"env value":    func(in *Input) { in.Env = map[string]string{"A": "2"} },
		"args":         func(in *Input) { in.Args = []string{"1"} },
		"args order":   func(in *Input) { in.Args = []string{"2", "1"} },
		"args order 2": func(in *Input) { in.Args = []string{"1", "2"} },
		"return_files": func(in *Input) { in.ReturnFiles = []string{"*.png"} },
	} {
		h := hash(f)
		if other, dup := seen[h]; dup {
			t.Errorf("%s hashes like %s", name, other)
		}
		seen[h] = name
	}
	utf := hash(func(in *Input) { in.Files = []InputFile{{Path: "a", Content: "x"}} })
	b64 := hash(func(in *Input) { in.Files = []InputFile{{Path: "a", Content: "eA==", Encoding: "base64"}} })
	if utf != b64 {
		t.Error("the same file as utf8 and as base64 hash differently")
	}
}
