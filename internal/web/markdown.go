package web

import (
	"bytes"
	"html/template"
	"regexp"
	"strconv"
	"strings"

	"github.com/yuin/goldmark"
	"github.com/yuin/goldmark/ast"
	"github.com/yuin/goldmark/extension"
	east "github.com/yuin/goldmark/extension/ast"
	"github.com/yuin/goldmark/renderer"
	"github.com/yuin/goldmark/text"
	"github.com/yuin/goldmark/util"
)

// Markdown is parsed by goldmark (CommonMark with GFM tables). What is ours
// is the part that makes it safe for our pages and their strict CSP:
//   - raw HTML is never passed through: inline and block HTML are written
//     out as escaped text, so a doc cannot inject markup or script;
//   - link targets are limited to http(s), mailto, anchors and
//     repository-relative paths (resolved to pages or repository files);
//     any other link renders its text in a <span>;
//   - headings get stable GitHub-like anchors and feed the table of
//     contents; table alignment is a class, never a style attribute.

// heading is one rendered heading, for the page's table of contents.
type heading struct {
	Level int
	ID    string
	Text  string
}

// document is a rendered Markdown file.
type document struct {
	Title    string // text of the first level-1 heading
	HTML     template.HTML
	Headings []heading
}

// linkResolver maps a relative link target (e.g. "SECURITY.md#keys") to the
// URL the page should use; ok=false renders the link text without a link.
type linkResolver func(dest string) (href string, ok bool)

type markdown struct {
	resolve linkResolver
}

var (
	reTags      = regexp.MustCompile(`<[^>]*>`)
	reLangClass = regexp.MustCompile(`[^a-z0-9_+-]`)
	reScheme    = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9+.-]*):`)
)

// renderMarkdown renders src. resolve may be nil: relative links are then dropped.
func renderMarkdown(src string, resolve linkResolver) document {
	m := &markdown{resolve: resolve}
	md := goldmark.New(
		goldmark.WithExtensions(extension.NewTable(extension.WithTableCellAlignMethod(extension.TableCellAlignNone))),
		// Priority 1 registers last, over goldmark's own renderers.
		goldmark.WithRendererOptions(renderer.WithNodeRenderers(util.Prioritized(m, 1))),
	)
	source := []byte(src)
	root := md.Parser().Parse(text.NewReader(source))
	doc := annotate(root, source)
	var b bytes.Buffer
	if err := md.Renderer().Render(&b, source, root); err != nil {
		// Rendering writes to memory; an error is a bug in a renderer.
		b.Reset()
		b.WriteString("<pre>" + template.HTMLEscapeString(src) + "</pre>\n")
	}
	doc.HTML = template.HTML(b.String())
	return doc
}

// annotate gives headings their ids and table cells their alignment
// classes, and collects the title and the headings.
func annotate(root ast.Node, source []byte) document {
	var doc document
	ids := map[string]int{}
	_ = ast.Walk(root, func(n ast.Node, entering bool) (ast.WalkStatus, error) {
		if !entering {
			return ast.WalkContinue, nil
		}
		switch n := n.(type) {
		case *ast.Heading:
			plain := plainText(n, source)
			id := slug(plain)
			if id == "" {
				id = "section"
			}
			if k := ids[id]; k > 0 {
				ids[id] = k + 1
				id += "-" + strconv.Itoa(k)
			} else {
				ids[id] = 1
			}
			n.SetAttributeString("id", []byte(id))
			if n.Level == 1 && doc.Title == "" {
				doc.Title = plain
			}
			doc.Headings = append(doc.Headings, heading{Level: n.Level, ID: id, Text: plain})
			return ast.WalkSkipChildren, nil
		case *east.TableCell:
			switch n.Alignment {
			case east.AlignLeft:
				n.SetAttributeString("class", []byte("align-left"))
			case east.AlignRight:
				n.SetAttributeString("class", []byte("align-right"))
			case east.AlignCenter:
				n.SetAttributeString("class", []byte("align-center"))
			}
		}
		return ast.WalkContinue, nil
	})
	return doc
}

// plainText is the text of n's inline content, without markup.
func plainText(n ast.Node, source []byte) string {
	var b strings.Builder
	_ = ast.Walk(n, func(c ast.Node, entering bool) (ast.WalkStatus, error) {
		if !entering {
			return ast.WalkContinue, nil
		}
		switch c := c.(type) {
		case *ast.Text:
			b.Write(c.Value(source))
			if c.SoftLineBreak() || c.HardLineBreak() {
				b.WriteByte(' ')
			}
		case *ast.String:
			b.Write(c.Value)
		case *ast.RawHTML:
			for i := 0; i < c.Segments.Len(); i++ {
				s := c.Segments.At(i)
				b.Write(s.Value(source))
			}
		case *ast.AutoLink:
			b.Write(c.Label(source))
		}
		return ast.WalkContinue, nil
	})
	return strings.TrimSpace(b.String())
}

// RegisterFuncs overrides goldmark's renderers where ours must differ.
func (m *markdown) RegisterFuncs(reg renderer.NodeRendererFuncRegisterer) {
	reg.Register(ast.KindRawHTML, m.rawHTML)
	reg.Register(ast.KindHTMLBlock, m.htmlBlock)
	reg.Register(ast.KindLink, m.link)
	reg.Register(ast.KindAutoLink, m.autoLink)
	reg.Register(ast.KindImage, m.image)
	reg.Register(ast.KindFencedCodeBlock, m.fencedCode)
	reg.Register(east.KindTable, m.table)
}

// fencedCode keeps only [a-z0-9_+-] of the info word for the class, so a
// fence's info string cannot smuggle anything into the attribute.
func (m *markdown) fencedCode(w util.BufWriter, source []byte, n ast.Node, entering bool) (ast.WalkStatus, error) {
	if !entering {
		return ast.WalkContinue, nil
	}
	fc := n.(*ast.FencedCodeBlock)
	_, _ = w.WriteString("<pre><code")
	if lang := reLangClass.ReplaceAllString(strings.ToLower(string(fc.Language(source))), ""); lang != "" {
		_, _ = w.WriteString(` class="language-` + lang + `"`)
	}
	_, _ = w.WriteString(">")
	for i := 0; i < fc.Lines().Len(); i++ {
		s := fc.Lines().At(i)
		escape(w, s.Value(source))
	}
	_, _ = w.WriteString("</code></pre>\n")
	return ast.WalkSkipChildren, nil
}

func (m *markdown) rawHTML(w util.BufWriter, source []byte, n ast.Node, entering bool) (ast.WalkStatus, error) {
	if entering {
		segs := n.(*ast.RawHTML).Segments
		for i := 0; i < segs.Len(); i++ {
			s := segs.At(i)
			escape(w, s.Value(source))
		}
	}
	return ast.WalkSkipChildren, nil
}

// htmlBlock writes a block of HTML as a paragraph of its escaped text.
func (m *markdown) htmlBlock(w util.BufWriter, source []byte, n ast.Node, entering bool) (ast.WalkStatus, error) {
	if !entering {
		return ast.WalkContinue, nil
	}
	hb := n.(*ast.HTMLBlock)
	var raw bytes.Buffer
	for i := 0; i < hb.Lines().Len(); i++ {
		s := hb.Lines().At(i)
		raw.Write(s.Value(source))
	}
	if hb.HasClosure() {
		raw.Write(hb.ClosureLine.Value(source))
	}
	_, _ = w.WriteString("<p>")
	escape(w, bytes.TrimRight(raw.Bytes(), "\n"))
	_, _ = w.WriteString("</p>\n")
	return ast.WalkSkipChildren, nil
}

func (m *markdown) link(w util.BufWriter, source []byte, n ast.Node, entering bool) (ast.WalkStatus, error) {
	m.openLink(w, string(n.(*ast.Link).Destination), entering)
	return ast.WalkContinue, nil
}

// image renders as a link to the image: the pages load no images from
// documents.
func (m *markdown) image(w util.BufWriter, source []byte, n ast.Node, entering bool) (ast.WalkStatus, error) {
	m.openLink(w, string(n.(*ast.Image).Destination), entering)
	return ast.WalkContinue, nil
}

func (m *markdown) autoLink(w util.BufWriter, source []byte, n ast.Node, entering bool) (ast.WalkStatus, error) {
	if !entering {
		return ast.WalkContinue, nil
	}
	al := n.(*ast.AutoLink)
	dest := string(al.URL(source))
	if al.AutoLinkType == ast.AutoLinkEmail && !strings.HasPrefix(strings.ToLower(dest), "mailto:") {
		dest = "mailto:" + dest
	}
	m.openLink(w, dest, true)
	escape(w, al.Label(source))
	m.openLink(w, dest, false)
	return ast.WalkContinue, nil
}

// openLink writes the start or end of a link to dest: <a> when dest is
// allowed, else <span>.
func (m *markdown) openLink(w util.BufWriter, dest string, entering bool) {
	href, ok := m.href(dest)
	switch {
	case entering && ok:
		_, _ = w.WriteString(`<a href="` + template.HTMLEscapeString(href) + `">`)
	case entering:
		_, _ = w.WriteString("<span>")
	case ok:
		_, _ = w.WriteString("</a>")
	default:
		_, _ = w.WriteString("</span>")
	}
}

// table wraps a table so that a wide one scrolls on its own.
func (m *markdown) table(w util.BufWriter, source []byte, n ast.Node, entering bool) (ast.WalkStatus, error) {
	if entering {
		_, _ = w.WriteString(`<div class="table-wrap"><table>` + "\n")
	} else {
		_, _ = w.WriteString("</table></div>\n")
	}
	return ast.WalkContinue, nil
}

// inlineMarkdown renders a one-paragraph description without the <p>.
func inlineMarkdown(s string) string {
	h := string(renderMarkdown(s, nil).HTML)
	if inner, ok := strings.CutPrefix(h, "<p>"); ok {
		if inner, ok := strings.CutSuffix(inner, "</p>\n"); ok && !strings.Contains(inner, "<p>") {
			return inner
		}
	}
	return h
}

func escape(w util.BufWriter, b []byte) {
	_, _ = w.Write(util.EscapeHTML(b))
}

// slug makes a heading's text into an anchor: lower-case letters and digits
// joined by hyphens, like GitHub's.
func slug(s string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_':
			if dash && b.Len() > 0 {
				b.WriteByte('-')
			}
			dash = false
			b.WriteRune(r)
		case r == ' ' || r == '-':
			dash = true
		}
	}
	return b.String()
}

// href vets a link target. Only http, https and mailto schemes pass;
// anchors pass as they are; other relative targets go through the resolver.
func (m *markdown) href(dest string) (string, bool) {
	if dest == "" {
		return "", false
	}
	for _, r := range dest {
		if r < 0x21 || r == 0x7f {
			return "", false
		}
	}
	if sm := reScheme.FindStringSubmatch(dest); sm != nil {
		switch strings.ToLower(sm[1]) {
		case "http", "https", "mailto":
			return dest, true
		}
		return "", false
	}
	if strings.HasPrefix(dest, "#") {
		return dest, true
	}
	if strings.HasPrefix(dest, "//") || strings.HasPrefix(dest, `\`) {
		return "", false
	}
	if m.resolve == nil {
		return "", false
	}
	return m.resolve(dest)
}
