package api

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
)

// DefaultBodyBudget is Options.BodyBudget's default: the request bodies
// the server reads and decodes at once, in bytes of memory.
const DefaultBodyBudget = 512 << 20

// decodeCost is what a body costs in memory while it is read and decoded,
// in multiples of its size: the body itself, the decoded strings and the
// decoder's copies of them.
const decodeCost = 4

// bodyBudget is a server-wide count of the memory held by request bodies.
// A request that would pass it is refused at once (503 overloaded), rather
// than letting parallel large bodies take the host's memory.
type bodyBudget struct {
	mu          sync.Mutex
	used, limit int64
}

// take reserves n bytes, or reports false when they are not there.
func (b *bodyBudget) take(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.limit {
		return false
	}
	b.used += n
	return true
}

func (b *bodyBudget) give(n int64) {
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
}

// errBodyBudget is the refusal of a body the budget has no room for.
func errBodyBudget() error {
	e := errorf(KindOverloaded, "the server is reading too many large requests; retry shortly")
	e.RetryAfter = 1
	return e
}

// readChunk is how much of a body of unknown length is reserved and read
// at a time.
const readChunk = 64 << 10

// readBody reads at most limit bytes of r's body within the budget, and
// returns it with the function that gives its reservation back (call it
// once the body is decoded). A declared length is reserved whole before
// anything is read; a body without one is reserved as it arrives.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, func(), error) {
	var held int64
	release := func() { s.bodies.give(held) }
	take := func(n int64) bool {
		if !s.bodies.take(decodeCost * n) {
			return false
		}
		held += decodeCost * n
		return true
	}
	body := http.MaxBytesReader(w, r.Body, limit)
	tooLarge := func() error { return errorf(KindPayloadTooLarge, "request body is over %d bytes", limit) }
	readErr := func(err error) error {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return tooLarge()
		}
		return errorf(KindInvalidRequest, "could not read the request body")
	}
	if n := r.ContentLength; n >= 0 {
		if n > limit {
			return nil, func() {}, tooLarge()
		}
		if !take(n) {
			return nil, func() {}, errBodyBudget()
		}
		buf := make([]byte, n)
		if _, err := io.ReadFull(body, buf); err != nil {
			release()
			return nil, func() {}, readErr(err)
		}
		return buf, release, nil
	}
	var buf []byte
	for {
		if !take(readChunk) {
			release()
			return nil, func() {}, errBodyBudget()
		}
		buf = append(buf, make([]byte, readChunk)...)
		k, err := io.ReadFull(body, buf[len(buf)-readChunk:])
		buf = buf[:len(buf)-readChunk+k]
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return buf, release, nil
		}
		if err != nil {
			release()
			return nil, func() {}, readErr(err)
		}
	}
}

// maxDecodedBytes bounds what a valid execution request of plan p holds
// once its escapes are decoded: the caps of every field and the JSON around
// them, as maxBodyBytes counts them but without the room for escaping.
func (s *Server) maxDecodedBytes(p config.Plan) int64 {
	n := int64(s.exec.MaxCodeBytes() + s.exec.MaxStdinBytes())
	n += p.FilesBytes()
	n += int64(p.FilesLimit()) * (execution.MaxPathBytes + 64)
	n += execution.MaxEnvBytes + execution.MaxEnv*16
	n += execution.MaxArgsBytes + execution.MaxArgs*8
	n += execution.MaxReturnGlobs * (execution.MaxGlobBytes + 8)
	return n + 64<<10
}

// decodedSize is the size of body once every string escape in it is
// decoded to UTF-8 (the structure's bytes count as themselves). It reads
// the body once and allocates nothing, so a body whose decoded content is
// over the plan's caps is refused before anything is expanded. A body that
// is not valid JSON gets a number that decoding then refuses anyway.
func decodedSize(body []byte) int64 {
	n := int64(len(body))
	for i := 0; i < len(body); i++ {
		if body[i] != '\\' || i+1 >= len(body) {
			continue
		}
		if body[i+1] != 'u' {
			n-- // \n, \", \\ ...: two bytes for one
			i++
			continue
		}
		r, ok := hex4(body, i+2)
		if !ok {
			i++
			continue
		}
		switch {
		case r < 0x80:
			n -= 5
		case r < 0x800 || (r >= 0xd800 && r < 0xe000): // a surrogate is half of a 4-byte character
			n -= 4
		default:
			n -= 3
		}
		i += 5
	}
	return n
}

// filesDecodedSize walks an execution request's body without decoding it
// and returns the decoded size of its files' contents (base64 counted as
// the bytes it decodes to), stopping as soon as the running total passes
// limit. ok is false when the body is not the expected shape; decoding
// then says what is wrong with it.
func filesDecodedSize(body []byte, limit int64) (total int64, ok bool) {
	sc := jsonScanner{b: body}
	if !sc.expect('{') {
		return 0, false
	}
	for !sc.peek('}') {
		key, ok := sc.str()
		if !ok || !sc.expect(':') {
			return 0, false
		}
		if string(body[key.start:key.end]) != "files" || !sc.peek('[') {
			if !sc.skip() {
				return 0, false
			}
		} else {
			sc.i++
			for !sc.peek(']') {
				n, ok := sc.fileContent()
				if !ok {
					return 0, false
				}
				if total += n; total > limit {
					return total, true
				}
				sc.comma()
			}
			sc.i++
		}
		sc.comma()
	}
	return total, true
}

// jsonScanner reads JSON text lightly: it finds strings and skips values,
// and leaves every other check to encoding/json.
type jsonScanner struct {
	b []byte
	i int
}

type span struct {
	start, end int // the string's text between its quotes
	decoded    int64
}

func (s *jsonScanner) ws() {
	for s.i < len(s.b) && (s.b[s.i] == ' ' || s.b[s.i] == '\t' || s.b[s.i] == '\n' || s.b[s.i] == '\r') {
		s.i++
	}
}

func (s *jsonScanner) peek(c byte) bool {
	s.ws()
	return s.i < len(s.b) && s.b[s.i] == c
}

func (s *jsonScanner) expect(c byte) bool {
	if !s.peek(c) {
		return false
	}
	s.i++
	return true
}

func (s *jsonScanner) comma() {
	if s.peek(',') {
		s.i++
	}
}

// str reads a string, with its decoded size.
func (s *jsonScanner) str() (span, bool) {
	if !s.expect('"') {
		return span{}, false
	}
	start := s.i
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case '\\':
			s.i += 2
		case '"':
			sp := span{start: start, end: s.i, decoded: decodedSize(s.b[start:s.i])}
			s.i++
			return sp, true
		default:
			s.i++
		}
	}
	return span{}, false
}

// skip skips one value of any kind.
func (s *jsonScanner) skip() bool {
	s.ws()
	if s.i >= len(s.b) {
		return false
	}
	switch s.b[s.i] {
	case '"':
		_, ok := s.str()
		return ok
	case '{', '[':
		depth := 0
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case '"':
				if _, ok := s.str(); !ok {
					return false
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					s.i++
					return true
				}
			}
			s.i++
		}
		return false
	default: // a number, true, false or null
		for s.i < len(s.b) && !strings.ContainsRune(",}] \t\r\n", rune(s.b[s.i])) {
			s.i++
		}
		return true
	}
}

// fileContent reads one files entry and returns the decoded size of its
// content.
func (s *jsonScanner) fileContent() (int64, bool) {
	if !s.expect('{') {
		return 0, false
	}
	var content int64
	base64 := false
	for !s.peek('}') {
		key, ok := s.str()
		if !ok || !s.expect(':') {
			return 0, false
		}
		switch string(s.b[key.start:key.end]) {
		case "content", "encoding":
			v, ok := s.str()
			if !ok {
				return 0, false
			}
			if string(s.b[key.start:key.end]) == "content" {
				content = v.decoded
			} else {
				base64 = string(s.b[v.start:v.end]) == "base64"
			}
		default:
			if !s.skip() {
				return 0, false
			}
		}
		s.comma()
	}
	s.i++
	if base64 {
		content = content / 4 * 3
	}
	return content, true
}
