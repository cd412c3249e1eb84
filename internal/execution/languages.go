package execution

import (
	"fmt"
	"sort"
	"strings"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/lang"
)

// Languages are the runnable languages, by canonical name and alias.
type Languages struct {
	byName map[string]engine.Language
	list   []LanguageInfo
}

// LanguageInfo is one language as GET /v1/languages shows it.
type LanguageInfo struct {
	Name    string   `json:"name"`
	Version *string  `json:"version"`
	Aliases []string `json:"aliases"`
}

// NewLanguages indexes ls; a language given twice is an error.
func NewLanguages(ls []engine.Language) (Languages, error) {
	out := Languages{byName: map[string]engine.Language{}}
	for _, l := range ls {
		if _, dup := out.byName[l.Name]; dup {
			return Languages{}, fmt.Errorf("execution: language %q configured twice", l.Name)
		}
		out.byName[l.Name] = l
		// The other names a request may use (lang.Def.Aliases).
		names := lang.Aliases(l.Name)
		for _, a := range names {
			out.byName[a] = l
		}
		info := LanguageInfo{Name: l.Name, Aliases: append([]string{}, names...)}
		if l.Version != "" {
			v := l.Version
			info.Version = &v
		}
		out.list = append(out.list, info)
	}
	sort.Slice(out.list, func(i, j int) bool { return out.list[i].Name < out.list[j].Name })
	return out, nil
}

// Lookup accepts any case and surrounding spaces.
func (l Languages) Lookup(name string) (engine.Language, bool) {
	lang, ok := l.byName[strings.ToLower(strings.TrimSpace(name))]
	return lang, ok
}

// Names lists the canonical names, "bash, javascript, python".
func (l Languages) Names() string {
	var n []string
	for _, i := range l.list {
		n = append(n, i.Name)
	}
	return strings.Join(n, ", ")
}

// List is every language, sorted by name.
func (l Languages) List() []LanguageInfo { return l.list }
