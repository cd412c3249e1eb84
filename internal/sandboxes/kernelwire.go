package sandboxes

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// A kernel (kernels/*.py, *.js) writes each of its messages as one line
// on its stdout: kernelMark, a JSON object, "\n". Anything else there is
// raw output of the cell (a subprocess or a C extension writing to fd 1).
var kernelMark = []byte("\x1evtl:")

// maxKernelLine bounds one message: a result's image, base64, is the
// biggest (the kernels send output in pieces of 64 KiB). A longer line is
// dropped, and the cell is told.
const maxKernelLine = 8 << 20

// kernelMsg is one message of a kernel, or raw output (T "raw").
type kernelMsg struct {
	T         string     `json:"t"` // ready, stdout, stderr, result, error, end; raw, dropped
	D         string     `json:"d"`
	Main      bool       `json:"main"`
	Data      mimeBundle `json:"data"`
	Name      string     `json:"name"`
	Value     string     `json:"value"`
	Traceback string     `json:"traceback"`
	N         int64      `json:"n"`
	Count     int        `json:"count"`
}

// maxMIMEKeys bounds a result's bundle: a line of a million tiny keys
// would cost the server far more memory as a map than as bytes.
const maxMIMEKeys = 32

// mimeBundle is a result's data: MIME type to content.
type mimeBundle map[string]string

// UnmarshalJSON reads an object of strings, refusing one of more than
// maxMIMEKeys keys before it holds them.
func (m *mimeBundle) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil {
		return err
	} else if t == nil {
		*m = nil
		return nil
	} else if t != json.Delim('{') {
		return errors.New("a MIME bundle is an object")
	}
	out := mimeBundle{}
	for dec.More() {
		if len(out) == maxMIMEKeys {
			return fmt.Errorf("a MIME bundle has more than %d types", maxMIMEKeys)
		}
		kt, err := dec.Token()
		if err != nil {
			return err
		}
		key, _ := kt.(string)
		var v string
		if err := dec.Decode(&v); err != nil {
			return err
		}
		out[key] = v
	}
	*m = out
	return nil
}

// kernelSplitter turns a kernel's stdout chunks into messages.
type kernelSplitter struct {
	buf      []byte
	dropping bool // inside a line over maxKernelLine, until its newline
	// scanned is how much of a message at the start of buf is known to
	// hold no newline: a big one arrives in many chunks, and each is
	// searched once.
	scanned int
}

// feed takes the next chunk and returns the messages it completes.
func (k *kernelSplitter) feed(p []byte) []kernelMsg {
	var out []kernelMsg
	for len(p) > 0 {
		if k.dropping {
			i := bytes.IndexByte(p, '\n')
			if i < 0 {
				return out
			}
			k.dropping, p = false, p[i+1:]
			continue
		}
		k.buf = append(k.buf, p...)
		p = nil
		out = append(out, k.drain()...)
	}
	return out
}

// drain takes every complete message and raw run out of buf.
func (k *kernelSplitter) drain() []kernelMsg {
	var out []kernelMsg
	for len(k.buf) > 0 {
		i := bytes.Index(k.buf, kernelMark)
		switch {
		case i > 0:
			out = append(out, kernelMsg{T: "raw", D: string(k.buf[:i])})
			k.buf = k.buf[i:]
			continue
		case i < 0:
			// Keep a tail that may be the start of a marker.
			keep := 0
			for n := min(len(kernelMark)-1, len(k.buf)); n > 0; n-- {
				if bytes.HasPrefix(kernelMark, k.buf[len(k.buf)-n:]) {
					keep = n
					break
				}
			}
			if raw := len(k.buf) - keep; raw > 0 {
				out = append(out, kernelMsg{T: "raw", D: string(k.buf[:raw])})
				k.buf = append(k.buf[:0], k.buf[raw:]...)
			}
			return out
		}
		nl := bytes.IndexByte(k.buf[k.scanned:], '\n')
		if nl < 0 {
			k.scanned = len(k.buf)
			if len(k.buf) > maxKernelLine {
				out = append(out, kernelMsg{T: "dropped"})
				k.buf, k.dropping, k.scanned = nil, true, 0
			}
			return out
		}
		nl += k.scanned
		k.scanned = 0
		line := k.buf[len(kernelMark):nl]
		var m kernelMsg
		if nl > maxKernelLine {
			m = kernelMsg{T: "dropped"}
		} else if err := json.Unmarshal(line, &m); err != nil || m.T == "" || m.T == "raw" || m.T == "dropped" {
			// Not one of the kernel's: the cell wrote the marker itself.
			m = kernelMsg{T: "raw", D: string(k.buf[:nl+1])}
		}
		out = append(out, m)
		k.buf = k.buf[nl+1:]
	}
	k.buf = nil // a big message's array is not kept
	return out
}

// rest is what is left at the end: raw output without a newline.
func (k *kernelSplitter) rest() string {
	s := string(k.buf)
	k.buf = nil
	return s
}
