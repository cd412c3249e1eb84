package execution

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"math"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/bmatcuk/doublestar/v4"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// Input is a request's fields as the client sent them. Pointers tell a
// missing field from a zero one.
type Input struct {
	// Image names the image to run on; nil means config.DefaultImage.
	Image    *string
	Language *string
	Code     *string
	TimeoutS *float64
	Stdin    *string
	// Files are placed in the program's working directory; Env is added to
	// its environment; Args follow the code file on its command line;
	// ReturnFiles are globs of files to send back. All optional.
	Files       []InputFile
	Env         map[string]string
	Args        []string
	ReturnFiles []string
	// WebhookURL receives the result of an async execution (Submit,
	// SubmitBatch); Run refuses it.
	WebhookURL *string
	// Network asks for a narrower allowlist than the plan's; nil is the
	// plan's own, an empty Allow none (NetworkFor).
	Network *NetworkRequest `json:",omitempty"`
}

// InputFile is one file of a request as the client sent it: Content is
// text when Encoding is "utf8" (or empty), base64 when it is "base64".
type InputFile struct {
	Path     string
	Content  string
	Encoding string
}

// prepared is a validated request: the Spec to run, complete (every
// default applied here, once: the timeout, the image, and the limits
// through config.Plan.Limits), and its hash.
type prepared struct {
	spec engine.Spec
	// image is the name of the image the request resolved to and
	// imageBuild its build id now ("" when unknown): what the execution
	// records as having run it.
	image, imageBuild string
	// network is what the sandbox may reach; nil for none.
	network *Network
	// hash identifies the request for Idempotency-Key: the canonical
	// language, code, stdin and effective timeout, so "py" and "python"
	// (or an omitted and an explicit default timeout) are the same request.
	hash string
}

// InvalidTimeout is the refusal of a timeout_s outside the caller's plan.
func InvalidTimeout(c Caller) *Error {
	return Errorf(KindInvalidTimeout, "timeout_s must be between 1 and %d seconds on plan %s", c.Plan.MaxTimeoutS, c.Key.Plan)
}

// prepare checks in and turns it into a Spec. Every problem is named, so a
// client (or an agent) can fix its request without guessing.
func (s *Service) prepare(c Caller, in Input) (prepared, error) {
	img, err := s.lookupImage(c, in.Image)
	if err != nil {
		return prepared{}, err
	}
	switch {
	case in.Language == nil:
		return prepared{}, Errorf(KindInvalidRequest, "language is required (one of %s)", img.langs.Names())
	case in.Code == nil:
		return prepared{}, Errorf(KindInvalidRequest, "code is required")
	}
	lang, ok := img.langs.Lookup(*in.Language)
	if !ok {
		return prepared{}, Errorf(KindUnsupportedLanguage, "language %q is not supported; use one of %s (see /v1/languages)", clip(*in.Language, 40), img.langs.Names())
	}
	code := *in.Code
	if code == "" {
		return prepared{}, Errorf(KindInvalidRequest, "code must not be empty")
	}
	if len(code) > s.opts.MaxCodeBytes {
		return prepared{}, Errorf(KindPayloadTooLarge, "code is %d bytes; the limit is %d bytes", len(code), s.opts.MaxCodeBytes)
	}
	var stdin string
	if in.Stdin != nil {
		stdin = *in.Stdin
	}
	if len(stdin) > s.opts.MaxStdinBytes {
		return prepared{}, Errorf(KindPayloadTooLarge, "stdin is %d bytes; the limit is %d bytes", len(stdin), s.opts.MaxStdinBytes)
	}
	timeoutS := c.Plan.DefaultTimeout()
	if in.TimeoutS != nil {
		t := *in.TimeoutS
		if math.IsNaN(t) || t < 1 || t > float64(c.Plan.MaxTimeoutS) {
			return prepared{}, InvalidTimeout(c)
		}
		timeoutS = t
	}
	files, err := checkFiles(c, lang, in.Files)
	if err != nil {
		return prepared{}, err
	}
	if err := CheckEnv(in.Env, true); err != nil {
		return prepared{}, err
	}
	if err := checkArgs(in.Args); err != nil {
		return prepared{}, err
	}
	if err := checkReturnFiles(in.ReturnFiles); err != nil {
		return prepared{}, err
	}
	nw, err := NetworkFor(c.Plan, in.Network)
	if err != nil {
		return prepared{}, err
	}
	var allow []string
	if nw != nil {
		if s.opts.Egress == nil || s.opts.Agent == "" {
			return prepared{}, Errorf(KindUnavailable, "this server cannot give executions a network (its egress or its agent binary is missing); send \"network\": {\"allow\": []} or ask the operator")
		}
		allow = nw.Allow
	}
	// The new fields are left out when empty, so a request without them
	// hashes as it did before they existed. Files hash by their decoded
	// bytes: the same file sent as utf8 or as base64 is the same request.
	type canonFile struct {
		Path    string `json:"path"`
		Content []byte `json:"content"`
	}
	var cfiles []canonFile
	for _, f := range files {
		cfiles = append(cfiles, canonFile{f.Path, f.Content})
	}
	// The default image is left out of the hash, so that requests from
	// before images existed hash as they did.
	imageName := ""
	if img.Name != config.DefaultImage {
		imageName = img.Name
	}
	canon, _ := json.Marshal(struct {
		Image       string            `json:"image,omitempty"`
		Language    string            `json:"language"`
		Code        string            `json:"code"`
		Stdin       string            `json:"stdin"`
		TimeoutS    float64           `json:"timeout_s"`
		Files       []canonFile       `json:"files,omitempty"`
		Env         map[string]string `json:"env,omitempty"`
		Args        []string          `json:"args,omitempty"`
		ReturnFiles []string          `json:"return_files,omitempty"`
		WebhookURL  string            `json:"webhook_url,omitempty"`
		Network     []string          `json:"network,omitempty"`
	}{imageName, lang.Name, code, stdin, timeoutS, cfiles, in.Env, in.Args, in.ReturnFiles, deref(in.WebhookURL), allow})
	sum := sha256.Sum256(canon)
	timeout := time.Duration(timeoutS * float64(time.Second))
	limits := c.Plan.Limits(timeout)
	if nw != nil {
		limits.Pids += engine.RelayPids
	}
	return prepared{
		spec: engine.Spec{
			Language:    lang,
			Code:        code,
			Stdin:       stdin,
			Timeout:     timeout,
			Files:       files,
			Env:         in.Env,
			Args:        in.Args,
			ReturnFiles: in.ReturnFiles,
			Limits:      limits,
		},
		image:      img.Name,
		imageBuild: s.images.builds.of(img.Dir),
		network:    nw,
		hash:       hex.EncodeToString(sum[:]),
	}, nil
}

// clip shortens client input echoed in a message.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// RequestHash is the hash Idempotency-Key claims are made with for in.
func (s *Service) RequestHash(c Caller, in Input) (string, error) {
	p, err := s.prepare(c, in)
	return p.hash, err
}

// Caps on a request's files, env, args and return globs that no plan
// changes (the count and size of files are the plan's).
const (
	MaxPathBytes      = 1024
	MaxComponentBytes = 255
	MaxPathDepth      = 16
	MaxEnv            = 64
	MaxEnvBytes       = 32 << 10 // names and values in all
	MaxArgs           = 64
	MaxArgsBytes      = 32 << 10
	MaxReturnGlobs    = 20
	MaxGlobBytes      = 256
)

// checkFiles validates and decodes a request's files.
func checkFiles(c Caller, lang engine.Language, in []InputFile) ([]engine.File, error) {
	if len(in) == 0 {
		return nil, nil
	}
	if limit := c.Plan.FilesLimit(); len(in) > limit {
		return nil, Errorf(KindPayloadTooLarge, "files has %d entries; plan %s allows %d", len(in), c.Key.Plan, limit)
	}
	out := make([]engine.File, 0, len(in))
	seen := make(map[string]int, len(in))
	var total int64
	for i, f := range in {
		if msg := badPath(f.Path); msg != "" {
			return nil, Errorf(KindInvalidRequest, "files[%d].path: %s", i, msg)
		}
		if f.Path == lang.File {
			return nil, Errorf(KindInvalidRequest, "files[%d].path: %s is the code file; send the program as code", i, lang.File)
		}
		if j, dup := seen[f.Path]; dup {
			return nil, Errorf(KindInvalidRequest, "files[%d].path: %q is also files[%d].path", i, clip(f.Path, 60), j)
		}
		seen[f.Path] = i
		var content []byte
		switch f.Encoding {
		case "", "utf8":
			content = []byte(f.Content)
		case "base64":
			b, err := base64.StdEncoding.Strict().DecodeString(f.Content)
			if err != nil {
				return nil, Errorf(KindInvalidRequest, "files[%d].content: not valid standard base64 with padding", i)
			}
			content = b
		default:
			return nil, Errorf(KindInvalidRequest, "files[%d].encoding: %q is not utf8 or base64", i, clip(f.Encoding, 20))
		}
		total += int64(len(content))
		out = append(out, engine.File{Path: f.Path, Content: content})
	}
	if limit := c.Plan.FilesBytes(); total > limit {
		return nil, Errorf(KindPayloadTooLarge, "files are %d bytes in all; plan %s allows %d bytes", total, c.Key.Plan, limit)
	}
	// A path that is a directory of another ("a" and "a/b"), or of the
	// code file ("main.py/x"), cannot be both.
	for i, f := range in {
		for dir := f.Path; ; {
			k := strings.LastIndexByte(dir, '/')
			if k < 0 {
				break
			}
			dir = dir[:k]
			if dir == lang.File {
				return nil, Errorf(KindInvalidRequest, "files[%d].path: %q is the code file, so it cannot be a directory", i, clip(dir, 60))
			}
			if j, ok := seen[dir]; ok {
				return nil, Errorf(KindInvalidRequest, "files[%d].path: %q is a file (files[%d]), so it cannot be a directory", i, clip(dir, 60), j)
			}
		}
	}
	return out, nil
}

// badPath says what is wrong with a file path, or "".
func badPath(p string) string {
	switch {
	case p == "":
		return "must not be empty"
	case len(p) > MaxPathBytes:
		return "is longer than 1024 bytes"
	case strings.HasPrefix(p, "/"):
		return "must be relative (no leading /)"
	case strings.ContainsRune(p, 0):
		return "must not contain a NUL byte"
	case strings.Contains(p, "\\"):
		return "must use / to separate directories, not a backslash"
	}
	parts := strings.Split(p, "/")
	if len(parts) > MaxPathDepth {
		return "is more than 16 levels deep"
	}
	for _, part := range parts {
		switch {
		case part == "":
			return "has an empty component (// or a trailing /)"
		case part == "." || part == "..":
			return "must not contain . or .. components"
		case len(part) > MaxComponentBytes:
			return "has a component longer than 255 bytes"
		}
	}
	return ""
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// reservedEnv are names the sandbox sets itself.
var reservedEnv = []string{"PATH", "HOME", "LANG", "PWD", "NODE_OPTIONS"}

// startupEnv are names that make the dynamic loader, the C library or an
// interpreter load or run other code, or write files, before the user's
// program starts (docs/SECURITY.md lists why each). They are refused so
// that no request relies on them, whatever a driver does with them;
// the drivers also keep every request name away from host processes.
var startupEnv = []string{
	"GCONV_PATH", "GLIBC_TUNABLES", "LOCPATH", "NLSPATH", "HOSTALIASES", "RESOLV_HOST_CONF", "TZDIR",
	"PYTHONSTARTUP", "PYTHONPATH", "PYTHONHOME", "PYTHONINSPECT", "PYTHONUSERBASE", "PYTHONPLATLIBDIR",
	"PYTHONEXECUTABLE", "PYTHONBREAKPOINT", "PYTHONWARNINGS", "PYTHONSAFEPATH", "PYTHONNOUSERSITE",
	"NODE_PATH", "NODE_REPL_EXTERNAL_MODULE", "NODE_EXTRA_CA_CERTS",
	"BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "IFS", "CDPATH", "GLOBIGNORE",
}

// startupEnvPrefixes are families of such names.
var startupEnvPrefixes = []string{"LD_", "MALLOC_", "BASH_FUNC_", "VERTAL_"}

// reservedName reports whether a request may not set the name n.
func reservedName(n string) bool {
	if slices.Contains(reservedEnv, n) || slices.Contains(startupEnv, n) {
		return true
	}
	for _, p := range startupEnvPrefixes {
		if strings.HasPrefix(n, p) {
			return true
		}
	}
	return false
}

// CheckEnv validates env against the caps every request shares: at most
// MaxEnv names, MaxEnvBytes in all, names of the shell's form, no NUL in
// a value. With reserve, the names the runner and interpreters start up
// with are refused too; a long-lived sandbox's commands are the caller's
// own shell, so it passes false there.
func CheckEnv(env map[string]string, reserve bool) error {
	if len(env) > MaxEnv {
		return Errorf(KindInvalidRequest, "env has %d names; the limit is %d", len(env), MaxEnv)
	}
	names := make([]string, 0, len(env))
	for n := range env {
		names = append(names, n)
	}
	sort.Strings(names)
	total := 0
	for _, n := range names {
		v := env[n]
		switch {
		case !envName.MatchString(n):
			return Errorf(KindInvalidRequest, "env[%q]: a name must match [A-Za-z_][A-Za-z0-9_]* and be at most 128 bytes", clip(n, 40))
		case reserve && reservedName(n):
			return Errorf(KindInvalidRequest, "env[%q]: the name is reserved (PATH, HOME, LANG, PWD, NODE_OPTIONS, VERTAL_*, "+
				"and the loader and interpreter start-up names: LD_*, MALLOC_*, GLIBC_TUNABLES, GCONV_PATH, PYTHON*PATH-style hooks, NODE_PATH, BASH_ENV, ENV; see docs/SECURITY.md)", n)
		case strings.ContainsRune(v, 0):
			return Errorf(KindInvalidRequest, "env[%q]: the value must not contain a NUL byte", n)
		}
		total += len(n) + len(v)
	}
	if total > MaxEnvBytes {
		return Errorf(KindInvalidRequest, "env is %d bytes (names and values); the limit is %d", total, MaxEnvBytes)
	}
	return nil
}

func checkArgs(args []string) error {
	if len(args) > MaxArgs {
		return Errorf(KindInvalidRequest, "args has %d entries; the limit is %d", len(args), MaxArgs)
	}
	total := 0
	for i, a := range args {
		if strings.ContainsRune(a, 0) {
			return Errorf(KindInvalidRequest, "args[%d]: must not contain a NUL byte", i)
		}
		total += len(a)
	}
	if total > MaxArgsBytes {
		return Errorf(KindInvalidRequest, "args are %d bytes in all; the limit is %d", total, MaxArgsBytes)
	}
	return nil
}

func checkReturnFiles(globs []string) error {
	if len(globs) > MaxReturnGlobs {
		return Errorf(KindInvalidRequest, "return_files has %d globs; the limit is %d", len(globs), MaxReturnGlobs)
	}
	for i, g := range globs {
		msg := ""
		switch {
		case g == "":
			msg = "must not be empty"
		case len(g) > MaxGlobBytes:
			msg = "is longer than 256 bytes"
		case strings.HasPrefix(g, "/"):
			msg = "must be relative to the working directory (no leading /)"
		case strings.ContainsRune(g, 0):
			msg = "must not contain a NUL byte"
		case slices.Contains(strings.Split(g, "/"), ".."):
			msg = "must not contain a .. component"
		case !doublestar.ValidatePattern(g):
			msg = "is not a valid glob (see doublestar: *, **, ?, [a-z], {a,b})"
		}
		if msg != "" {
			return Errorf(KindInvalidRequest, "return_files[%d]: %s", i, msg)
		}
	}
	return nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
