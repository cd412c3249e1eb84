package image

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/lang"
)

// chrootEnv is the whole environment of programs run inside the new root:
// nothing of the builder's environment leaks into version checks.
var chrootEnv = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/", "LANG=C.UTF-8"}

// RunInRoot runs argv (an absolute path inside rootfs) chrooted into
// rootfs, as root, with a clean environment, and returns its stdout. Tests
// and doctor use it to check an image without a sandbox runtime.
func RunInRoot(ctx context.Context, rootfs string, argv ...string) (string, error) {
	return runInRootEnv(ctx, rootfs, nil, argv...)
}

// runInRootEnv is RunInRoot with env added to the clean environment.
func runInRootEnv(ctx context.Context, rootfs string, env []string, argv ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := chrootCmd(ctx, rootfs, env, argv...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("running %s in %s: %w: %s", strings.Join(argv, " "), rootfs, err,
			truncate(strings.TrimSpace(stderr.String()), 300))
	}
	return stdout.String(), nil
}

// smokeTests prove each interpreter works beyond printing its version:
// Python imports modules that python3-minimal lacks (so the full standard
// library is there), Node evaluates code, Bash runs a builtin. The
// interpreters are package lang's; smokeCode replaces a language's Hello.
var smokeTests = func() []smokeTest {
	smokeCode := map[string]string{
		"python": "import json, sqlite3, ssl, decimal, ctypes, asyncio, email.mime.text, xml.etree.ElementTree, " +
			"unittest, zoneinfo, csv, hashlib, urllib.request, http.client, multiprocessing, venv; print(6*7)",
		"bash": "echo $((6*7))",
	}
	out := make([]smokeTest, len(lang.All))
	for i, d := range lang.All {
		code, ok := smokeCode[d.Name]
		if !ok {
			code = d.Hello
		}
		out[i] = smokeTest{d.Name, d.EvalArgv("", code), "42\n"}
	}
	return out
}()

type smokeTest struct {
	lang string
	argv []string
	want string
}

// detectVersions runs each interpreter inside rootfs and records its real
// version, after checking that it actually runs code.
func detectVersions(ctx context.Context, rootfs string) (Versions, error) {
	for _, t := range smokeTests {
		out, err := RunInRoot(ctx, rootfs, t.argv...)
		if err != nil {
			return Versions{}, fmt.Errorf("%s smoke test: %w", t.lang, err)
		}
		if out != t.want {
			return Versions{}, fmt.Errorf("%s smoke test printed %q, want %q", t.lang, out, t.want)
		}
	}
	var v Versions
	for _, c := range []struct {
		argv  []string
		parse func(string) (string, error)
		dst   *string
	}{
		{[]string{"/usr/bin/python3", "--version"}, ParsePythonVersion, &v.Python},
		{[]string{"/usr/local/bin/node", "--version"}, ParseNodeVersion, &v.JavaScript},
		{[]string{"/bin/bash", "--version"}, ParseBashVersion, &v.Bash},
	} {
		out, err := RunInRoot(ctx, rootfs, c.argv...)
		if err != nil {
			return Versions{}, err
		}
		if *c.dst, err = c.parse(out); err != nil {
			return Versions{}, err
		}
	}
	return v, nil
}
