package sandboxes

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// split feeds in to a splitter in chunks of n bytes (0: all at once) and
// returns the messages, adjacent raw runs merged, and the rest.
func split(in string, n int) []kernelMsg {
	var sp kernelSplitter
	var out []kernelMsg
	add := func(ms []kernelMsg) {
		for _, m := range ms {
			if l := len(out); m.T == "raw" && l > 0 && out[l-1].T == "raw" {
				out[l-1].D += m.D
				continue
			}
			out = append(out, m)
		}
	}
	if n <= 0 {
		n = len(in) + 1
	}
	for i := 0; i < len(in); i += n {
		add(sp.feed([]byte(in[i:min(len(in), i+n)])))
	}
	if r := sp.rest(); r != "" {
		add([]kernelMsg{{T: "raw", D: r}})
	}
	return out
}

func TestKernelSplitter(t *testing.T) {
	m := "\x1evtl:"
	for _, tc := range []struct {
		name string
		in   string
		want []kernelMsg
	}{
		{"message", m + `{"t":"stdout","d":"hi\n"}` + "\n", []kernelMsg{{T: "stdout", D: "hi\n"}}},
		{"raw then message", "from a child\n" + m + `{"t":"end","n":3,"count":2}` + "\n", []kernelMsg{{T: "raw", D: "from a child\n"}, {T: "end", N: 3, Count: 2}}},
		{"raw without newline before a message", "abc" + m + `{"t":"ready"}` + "\n", []kernelMsg{{T: "raw", D: "abc"}, {T: "ready"}}},
		{"raw at the end", "tail", []kernelMsg{{T: "raw", D: "tail"}}},
		{"a marker the cell wrote, not JSON", m + "not json\n", []kernelMsg{{T: "raw", D: m + "not json\n"}}},
		{"a marker with a reserved type", m + `{"t":"raw","d":"x"}` + "\n", []kernelMsg{{T: "raw", D: m + `{"t":"raw","d":"x"}` + "\n"}}},
		{"result", m + `{"t":"result","main":true,"data":{"text/plain":"42"}}` + "\n", []kernelMsg{{T: "result", Main: true, Data: mimeBundle{"text/plain": "42"}}}},
		{"an unfinished message stays", m + `{"t":"stdout"`, []kernelMsg{{T: "raw", D: m + `{"t":"stdout"`}}},
	} {
		for _, n := range []int{0, 1, 2, 7} {
			if diff := cmp.Diff(tc.want, split(tc.in, n)); diff != "" {
				t.Errorf("%s, chunks of %d (-want +got):\n%s", tc.name, n, diff)
			}
		}
	}
}

// A line over maxKernelLine is dropped whole, and what follows is read.
func TestKernelSplitterDropsHugeLine(t *testing.T) {
	var sp kernelSplitter
	huge := "\x1evtl:" + `{"t":"stdout","d":"` + strings.Repeat("x", maxKernelLine) + `"}` + "\n"
	var got []kernelMsg
	for i := 0; i < len(huge); i += 1 << 20 {
		got = append(got, sp.feed([]byte(huge[i:min(len(huge), i+1<<20)]))...)
	}
	got = append(got, sp.feed([]byte("\x1evtl:"+`{"t":"end","n":1}`+"\n"))...)
	want := []kernelMsg{{T: "dropped"}, {T: "end", N: 1}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if cap(sp.buf) > 2*maxKernelLine+(1<<20) {
		t.Errorf("the splitter holds %d bytes after the drop", cap(sp.buf))
	}
}

// FuzzKernelSplitter: whatever a cell writes, the splitter never panics,
// how the bytes are chunked does not change what it reads, and raw
// output is never lost or invented.
func FuzzKernelSplitter(f *testing.F) {
	f.Add("\x1evtl:{\"t\":\"stdout\",\"d\":\"hi\"}\nraw\n\x1evtl:{\"t\":\"end\",\"n\":1}\n", 3)
	f.Add("\x1evt\x1evtl:{}\n\x1e", 1)
	f.Fuzz(func(t *testing.T, in string, n int) {
		n = 1 + abs(n)%16
		whole, chunked := split(in, 0), split(in, n)
		if diff := cmp.Diff(whole, chunked); diff != "" {
			t.Fatalf("chunks of %d differ from the whole (-whole +chunked):\n%s", n, diff)
		}
		raw := 0
		for _, m := range whole {
			if m.T == "raw" {
				if !strings.Contains(in, m.D) {
					t.Fatalf("raw %q is not in the input", m.D)
				}
				raw += len(m.D)
			}
		}
		if raw > len(in) {
			t.Fatalf("%d raw bytes from %d", raw, len(in))
		}
	})
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}

// A bundle of too many types is not a result: the line is the cell's raw
// output, and no map of it is built.
func TestKernelSplitterRefusesHugeBundle(t *testing.T) {
	var b strings.Builder
	b.WriteString("\x1evtl:{\"t\":\"result\",\"data\":{")
	for i := 0; i <= maxMIMEKeys; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, "\"k%d\":\"\"", i)
	}
	b.WriteString("}}\n")
	got := split(b.String(), 0)
	if len(got) != 1 || got[0].T != "raw" {
		t.Fatalf("%d types: %+v", maxMIMEKeys+1, got)
	}
	ok := split("\x1evtl:{\"t\":\"result\",\"data\":{\"text/plain\":\"1\",\"text/html\":\"<b>1</b>\"}}\n", 0)
	if len(ok) != 1 || ok[0].T != "result" || len(ok[0].Data) != 2 {
		t.Fatalf("a bundle of two: %+v", ok)
	}
}
