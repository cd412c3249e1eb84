package image

// Tool is a command-line tool every image built by vertal image build
// carries, beyond Debian's minbase (coreutils, grep, sed, findutils, ...),
// because scripts such as HackerRank-style Bash solutions expect it: bc
// for arithmetic on decimals (without it `echo "scale=3; 1/3" | bc`
// prints nothing and the script "succeeds" with a wrong answer), jq for
// JSON, file to tell a file's type, and procps's ps, free, top, pgrep and
// pkill.
type Tool struct {
	Package  string   `json:"package"`
	Version  string   `json:"version"`
	Commands []string `json:"commands"`
}

// Tools are the tools of every built image; their versions come from the
// manifest (Manifest.Tools).
var Tools = []Tool{
	{Package: "bc", Commands: []string{"bc"}},
	{Package: "jq", Commands: []string{"jq"}},
	{Package: "file", Commands: []string{"file"}},
	{Package: "procps", Commands: []string{"ps", "free", "top", "pgrep", "pkill", "watch"}},
	// curl reaches what a plan's egress allows (HTTPS_PROXY), and fails
	// at once anywhere else.
	{Package: "curl", Commands: []string{"curl"}},
}

func toolPackages() []string {
	out := make([]string, len(Tools))
	for i, t := range Tools {
		out[i] = t.Package
	}
	return out
}

// Tools lists the Tools installed in the image, with their versions: an
// image built before a tool was added does not claim it.
func (m Manifest) Tools() []Tool {
	out := []Tool{}
	for _, t := range Tools {
		if v, ok := m.Packages.Dpkg[t.Package]; ok {
			t.Version = v
			t.Commands = append([]string(nil), t.Commands...)
			out = append(out, t)
		}
	}
	return out
}
