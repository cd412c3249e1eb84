package execution

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// Input is a request's fields as the client sent them. Pointers tell a
// missing field from a zero one.
type Input struct {
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
}

// InputFile is one file of a request as the client sent it: Content is
// text when Encoding is "utf8" (or empty), base64 when it is "base64".
type InputFile struct {
	Path     string
	Content  string
	Encoding string
}

// prepared is a validated request: the Spec to run (every default applied
// here, once) and its hash.
type prepared struct {
	spec engine.Spec
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
	switch {
	case in.Language == nil:
		return prepared{}, Errorf(KindInvalidRequest, "language is required (one of %s)", s.langs.Names())
	case in.Code == nil:
		return prepared{}, Errorf(KindInvalidRequest, "code is required")
	}
	lang, ok := s.langs.Lookup(*in.Language)
	if !ok {
		return prepared{}, Errorf(KindUnsupportedLanguage, "language %q is not supported; use one of %s (see /v1/languages)", clip(*in.Language, 40), s.langs.Names())
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
	canon, _ := json.Marshal(struct {
		Language string  `json:"language"`
		Code     string  `json:"code"`
		Stdin    string  `json:"stdin"`
		TimeoutS float64 `json:"timeout_s"`
	}{lang.Name, code, stdin, timeoutS})
	sum := sha256.Sum256(canon)
	return prepared{
		spec: engine.Spec{
			Language: lang,
			Code:     code,
			Stdin:    stdin,
			Timeout:  time.Duration(timeoutS * float64(time.Second)),
			Limits:   engine.Limits{MemoryBytes: c.Plan.MemoryBytes()}.WithDefaults(),
		},
		hash: hex.EncodeToString(sum[:]),
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
