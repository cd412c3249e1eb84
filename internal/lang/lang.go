// Package lang is the one table of the languages Vertal Run runs.
//
// Everything that knows a language by name takes it from here: the
// server's built-in language definitions (config), the names a request
// may use (execution), the CLI's guess from a file extension, the labels
// of the playground and of the MCP tool, the interpreters' baselines and
// the image checks. Adding a language starts with one entry in All; what
// is necessarily per language beyond it is the warm launcher (package
// launcher) and the attack programs of the security suite.
package lang

import "slices"

// Def is one language.
type Def struct {
	// Name is the canonical name requests and responses use.
	Name string
	// Label is the name people read ("JavaScript").
	Label string
	// Runtime is the interpreter's product name when it differs from
	// Label ("Node.js"), for agents choosing a language by what they know.
	Runtime string
	// Aliases are other names a request may use: the ones people and
	// agents actually type. Anything else is refused, not guessed.
	Aliases []string
	// Exts are the code-file extensions the CLI infers the language from.
	Exts []string
	// File is the code file's name in the sandbox's working directory.
	File string
	// Interpreter is the program that runs File, looked up on the image's
	// PATH; Path is where the default image has it.
	Interpreter, Path string
	// Eval is the interpreter's flag that runs code given as an argument
	// (baselines and image checks).
	Eval string
	// Hello is the smallest program that prints "42\n".
	Hello string
}

// All are the built-in languages, in the order they are listed.
var All = []Def{
	{Name: "python", Label: "Python", Aliases: []string{"py", "python3"}, Exts: []string{".py"},
		File: "main.py", Interpreter: "python3", Path: "/usr/bin/python3", Eval: "-c", Hello: "print(6*7)"},
	{Name: "javascript", Label: "JavaScript", Runtime: "Node.js", Aliases: []string{"js", "node", "nodejs"},
		Exts: []string{".js", ".mjs", ".cjs"}, File: "main.js", Interpreter: "node", Path: "/usr/local/bin/node",
		Eval: "-e", Hello: "console.log(6*7)"},
	{Name: "bash", Label: "Bash", Aliases: []string{"sh"}, Exts: []string{".sh", ".bash"},
		File: "main.sh", Interpreter: "bash", Path: "/bin/bash", Eval: "-c", Hello: "echo 42"},
}

// Get returns the language called name (canonical name only).
func Get(name string) (Def, bool) {
	i := slices.IndexFunc(All, func(d Def) bool { return d.Name == name })
	if i < 0 {
		return Def{}, false
	}
	return All[i], true
}

// Names are the canonical names, in All's order.
func Names() []string {
	out := make([]string, len(All))
	for i, d := range All {
		out[i] = d.Name
	}
	return out
}

// ByExt maps a lower-case file extension (".py") to a language name.
func ByExt(ext string) (string, bool) {
	for _, d := range All {
		if slices.Contains(d.Exts, ext) {
			return d.Name, true
		}
	}
	return "", false
}

// Aliases returns the aliases of the language called name (nil if none).
func Aliases(name string) []string {
	d, _ := Get(name)
	return slices.Clone(d.Aliases)
}

// EvalArgv is the command line that runs the language's code given as
// an argument with the interpreter at path (Path when empty).
func (d Def) EvalArgv(path, code string) []string {
	if path == "" {
		path = d.Path
	}
	return []string{path, d.Eval, code}
}
