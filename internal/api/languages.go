package api

import (
	"fmt"
	"net/http"
	"sort"
	"strings"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

// aliases are the other names a request may use for a language. They are
// the names people and agents actually type; anything else is refused
// rather than guessed.
var aliases = map[string][]string{
	"python":     {"py", "python3"},
	"javascript": {"js", "node", "nodejs"},
	"bash":       {"sh"},
}

type languages struct {
	byName map[string]engine.Language // canonical names and aliases
	list   []languageInfo
}

type languageInfo struct {
	Name    string   `json:"name"`
	Version *string  `json:"version"`
	Aliases []string `json:"aliases"`
}

func newLanguages(ls []engine.Language) (languages, error) {
	out := languages{byName: map[string]engine.Language{}}
	for _, l := range ls {
		if _, dup := out.byName[l.Name]; dup {
			return languages{}, fmt.Errorf("api: language %q configured twice", l.Name)
		}
		out.byName[l.Name] = l
		for _, a := range aliases[l.Name] {
			out.byName[a] = l
		}
		info := languageInfo{Name: l.Name, Aliases: append([]string{}, aliases[l.Name]...)}
		if l.Version != "" {
			v := l.Version
			info.Version = &v
		}
		out.list = append(out.list, info)
	}
	sort.Slice(out.list, func(i, j int) bool { return out.list[i].Name < out.list[j].Name })
	return out, nil
}

// lookup accepts any case and surrounding spaces.
func (l languages) lookup(name string) (engine.Language, bool) {
	lang, ok := l.byName[strings.ToLower(strings.TrimSpace(name))]
	return lang, ok
}

func (l languages) names() string {
	var n []string
	for _, i := range l.list {
		n = append(n, i.Name)
	}
	return strings.Join(n, ", ")
}

func (s *Server) listLanguages(w http.ResponseWriter, r *http.Request, _ *Caller) error {
	return s.writeJSON(w, r, http.StatusOK, struct {
		Languages []languageInfo `json:"languages"`
	}{s.langs.list})
}
