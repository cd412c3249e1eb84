package web

import (
	"html"
	"html/template"
	"regexp"
	"strconv"
	"strings"
)

// This file renders the Markdown subset our docs use: ATX headings, paragraphs,
// fenced code, bullet and numbered lists (nested by indentation), block
// quotes, pipe tables, rules, and inline code, strong, emphasis and links.
// Raw HTML is never passed through: every byte of input text leaves here
// escaped, and link targets are limited to http(s), mailto, anchors and
// repository-relative paths, so a doc cannot inject markup or script.

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
	ids     map[string]int
	doc     document
}

// renderMarkdown renders src. resolve may be nil: relative links are then dropped.
func renderMarkdown(src string, resolve linkResolver) document {
	m := &markdown{resolve: resolve, ids: map[string]int{}}
	src = strings.ReplaceAll(src, "\r\n", "\n")
	src = strings.ReplaceAll(src, "\r", "\n")
	var b strings.Builder
	m.blocks(&b, strings.Split(src, "\n"), false)
	m.doc.HTML = template.HTML(b.String())
	return m.doc
}

var (
	reHeading   = regexp.MustCompile(`^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*$`)
	reFence     = regexp.MustCompile("^( {0,3})(`{3,}|~{3,})[ \t]*([^`]*)$")
	reRule      = regexp.MustCompile(`^ {0,3}(?:(?:-[ \t]*){3,}|(?:\*[ \t]*){3,}|(?:_[ \t]*){3,})$`)
	reListItem  = regexp.MustCompile(`^( {0,3})([-*+]|[0-9]{1,9}[.)])(?:[ \t]+|$)`)
	reTableSep  = regexp.MustCompile(`^ {0,3}\|?[ \t]*:?-+:?[ \t]*(?:\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$`)
	reQuote     = regexp.MustCompile(`^ {0,3}> ?`)
	reLangClass = regexp.MustCompile(`[^a-z0-9_+-]`)
	reTags      = regexp.MustCompile(`<[^>]*>`)
	reScheme    = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9+.-]*):`)
)

func isBlank(s string) bool { return strings.TrimSpace(s) == "" }

// indentOf returns the width of s's leading whitespace, tabs counting 4.
func indentOf(s string) int {
	n := 0
	for _, c := range s {
		switch c {
		case ' ':
			n++
		case '\t':
			n += 4 - n%4
		default:
			return n
		}
	}
	return n
}

// dedent removes up to n columns of leading whitespace.
func dedent(s string, n int) string {
	col, i := 0, 0
	for i < len(s) && col < n {
		switch s[i] {
		case ' ':
			col++
		case '\t':
			col += 4 - col%4
		default:
			return s[i:]
		}
		i++
	}
	return s[i:]
}

// startsBlock reports whether line interrupts a paragraph.
func startsBlock(line string) bool {
	if reHeading.MatchString(line) || reFence.MatchString(line) || reRule.MatchString(line) || reQuote.MatchString(line) {
		return true
	}
	if m := reListItem.FindStringSubmatch(line); m != nil {
		// A numbered line only starts a list inside a paragraph at "1.", as
		// in CommonMark, so prose like "2024. was a year" stays prose.
		marker := m[2]
		if marker[0] >= '0' && marker[0] <= '9' && marker[:len(marker)-1] != "1" {
			return false
		}
		return !isBlank(line[len(m[0]):])
	}
	return false
}

// blocks renders lines as block elements. tight renders paragraphs without
// <p>, for the items of a tight list.
func (m *markdown) blocks(b *strings.Builder, lines []string, tight bool) {
	for i := 0; i < len(lines); {
		line := lines[i]
		switch {
		case isBlank(line):
			i++
		case reFence.MatchString(line):
			i = m.fence(b, lines, i)
		case reHeading.MatchString(line):
			m.heading(b, line)
			i++
		case reRule.MatchString(line):
			b.WriteString("<hr>\n")
			i++
		case reQuote.MatchString(line):
			var inner []string
			for i < len(lines) && reQuote.MatchString(lines[i]) {
				inner = append(inner, reQuote.ReplaceAllString(lines[i], ""))
				i++
			}
			b.WriteString("<blockquote>\n")
			m.blocks(b, inner, false)
			b.WriteString("</blockquote>\n")
		case reListItem.MatchString(line):
			i = m.list(b, lines, i)
		case strings.Contains(line, "|") && i+1 < len(lines) && reTableSep.MatchString(lines[i+1]) && strings.Contains(lines[i+1], "-"):
			i = m.table(b, lines, i)
		default:
			var para []string
			for i < len(lines) && !isBlank(lines[i]) && (len(para) == 0 || !startsBlock(lines[i])) {
				para = append(para, strings.TrimSpace(lines[i]))
				i++
			}
			text := m.inline(strings.Join(para, "\n"))
			if tight {
				b.WriteString(text)
				b.WriteString("\n")
			} else {
				b.WriteString("<p>" + text + "</p>\n")
			}
		}
	}
}

func (m *markdown) fence(b *strings.Builder, lines []string, i int) int {
	f := reFence.FindStringSubmatch(lines[i])
	indent, marker, info := len(f[1]), f[2], strings.Fields(f[3])
	var code []string
	i++
	for ; i < len(lines); i++ {
		t := strings.TrimSpace(lines[i])
		if strings.HasPrefix(t, marker[:1]) && strings.Trim(t, marker[:1]) == "" && len(t) >= len(marker) && indentOf(lines[i]) <= 3 {
			i++
			break
		}
		code = append(code, dedent(lines[i], indent))
	}
	b.WriteString("<pre><code")
	if len(info) > 0 {
		if lang := reLangClass.ReplaceAllString(strings.ToLower(info[0]), ""); lang != "" {
			b.WriteString(` class="language-` + lang + `"`)
		}
	}
	b.WriteString(">")
	b.WriteString(html.EscapeString(strings.Join(code, "\n")))
	b.WriteString("</code></pre>\n")
	return i
}

func (m *markdown) heading(b *strings.Builder, line string) {
	h := reHeading.FindStringSubmatch(line)
	level := len(h[1])
	text := strings.TrimSpace(h[2])
	// A closing sequence of #s is decoration, not text.
	if t := strings.TrimRight(text, "#"); t != text && (t == "" || strings.HasSuffix(t, " ")) {
		text = strings.TrimSpace(t)
	}
	inner := m.inline(text)
	plain := html.UnescapeString(reTags.ReplaceAllString(inner, ""))
	id := m.uniqueID(slug(plain))
	if level == 1 && m.doc.Title == "" {
		m.doc.Title = plain
	}
	m.doc.Headings = append(m.doc.Headings, heading{Level: level, ID: id, Text: plain})
	l := strconv.Itoa(level)
	b.WriteString("<h" + l + ` id="` + id + `">` + inner + "</h" + l + ">\n")
}

func (m *markdown) uniqueID(id string) string {
	if id == "" {
		id = "section"
	}
	n := m.ids[id]
	m.ids[id] = n + 1
	if n == 0 {
		return id
	}
	return id + "-" + strconv.Itoa(n)
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

func (m *markdown) list(b *strings.Builder, lines []string, i int) int {
	first := reListItem.FindStringSubmatch(lines[i])
	ordered := first[2][0] >= '0' && first[2][0] <= '9'
	delim := first[2][len(first[2])-1:]
	var items [][]string
	tight := true
	for i < len(lines) {
		mm := reListItem.FindStringSubmatch(lines[i])
		if mm == nil {
			break
		}
		isOrdered := mm[2][0] >= '0' && mm[2][0] <= '9'
		if isOrdered != ordered || mm[2][len(mm[2])-1:] != delim {
			break
		}
		content := len(mm[0])
		if isBlank(lines[i][len(mm[0]):]) {
			content = len(mm[1]) + len(mm[2]) + 1
		}
		item := []string{lines[i][len(mm[0]):]}
		i++
		for i < len(lines) {
			if isBlank(lines[i]) {
				// A blank line continues the item only if indented content follows.
				j := i
				for j < len(lines) && isBlank(lines[j]) {
					j++
				}
				if j < len(lines) && indentOf(lines[j]) >= content {
					tight = false
					for ; i < j; i++ {
						item = append(item, "")
					}
					continue
				}
				if j < len(lines) && reListItem.MatchString(lines[j]) && indentOf(lines[j]) < content {
					tight = false
				}
				i = j
				break
			}
			if indentOf(lines[i]) >= content {
				item = append(item, dedent(lines[i], content))
				i++
				continue
			}
			if reListItem.MatchString(lines[i]) || startsBlock(lines[i]) {
				break
			}
			item = append(item, strings.TrimSpace(lines[i])) // lazy continuation
			i++
		}
		items = append(items, item)
		if i > 0 && i < len(lines) && isBlank(lines[i-1]) && !reListItem.MatchString(lines[i]) {
			break
		}
	}
	tag := "ul"
	if ordered {
		tag = "ol"
	}
	b.WriteString("<" + tag)
	if ordered {
		if n, _ := strconv.Atoi(first[2][:len(first[2])-1]); n != 1 {
			b.WriteString(` start="` + strconv.Itoa(n) + `"`)
		}
	}
	b.WriteString(">\n")
	for _, item := range items {
		b.WriteString("<li>")
		m.blocks(b, item, tight)
		b.WriteString("</li>\n")
	}
	b.WriteString("</" + tag + ">\n")
	return i
}

func (m *markdown) table(b *strings.Builder, lines []string, i int) int {
	header := splitRow(lines[i])
	var align []string
	for _, c := range splitRow(lines[i+1]) {
		c = strings.TrimSpace(c)
		switch {
		case strings.HasPrefix(c, ":") && strings.HasSuffix(c, ":"):
			align = append(align, "center")
		case strings.HasSuffix(c, ":"):
			align = append(align, "right")
		default:
			align = append(align, "")
		}
	}
	cell := func(tag string, col int, text string) {
		b.WriteString("<" + tag)
		if col < len(align) && align[col] != "" {
			b.WriteString(` class="align-` + align[col] + `"`)
		}
		b.WriteString(">" + m.inline(strings.TrimSpace(text)) + "</" + tag + ">")
	}
	b.WriteString("<div class=\"table-wrap\"><table>\n<thead><tr>")
	for c, h := range header {
		cell("th", c, h)
	}
	b.WriteString("</tr></thead>\n<tbody>\n")
	for i += 2; i < len(lines) && !isBlank(lines[i]) && strings.Contains(lines[i], "|"); i++ {
		b.WriteString("<tr>")
		row := splitRow(lines[i])
		for c := range header {
			text := ""
			if c < len(row) {
				text = row[c]
			}
			cell("td", c, text)
		}
		b.WriteString("</tr>\n")
	}
	b.WriteString("</tbody>\n</table></div>\n")
	return i
}

// splitRow splits a table row on pipes that are neither escaped nor inside
// a code span.
func splitRow(line string) []string {
	line = strings.TrimSpace(line)
	line = strings.TrimPrefix(line, "|")
	if strings.HasSuffix(line, "|") && !strings.HasSuffix(line, `\|`) {
		line = line[:len(line)-1]
	}
	var cells []string
	var cur strings.Builder
	inCode := false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '\\' && i+1 < len(line) && line[i+1] == '|':
			cur.WriteByte('|')
			i++
		case c == '`':
			inCode = !inCode
			cur.WriteByte(c)
		case c == '|' && !inCode:
			cells = append(cells, cur.String())
			cur.Reset()
		default:
			cur.WriteByte(c)
		}
	}
	return append(cells, cur.String())
}

func isPunct(c byte) bool {
	return strings.IndexByte("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", c) >= 0
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c >= 0x80
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' }

// inline renders inline markup; everything that is not markup is escaped.
func (m *markdown) inline(s string) string {
	var b strings.Builder
	text := func(t string) { b.WriteString(html.EscapeString(t)) }
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '\\' && i+1 < len(s) && isPunct(s[i+1]):
			text(s[i+1 : i+2])
			i += 2
			continue
		case c == '`':
			n := runLen(s, i, '`')
			if end := findRun(s, i+n, '`', n); end >= 0 {
				code := strings.ReplaceAll(s[i+n:end], "\n", " ")
				if len(code) > 2 && code[0] == ' ' && code[len(code)-1] == ' ' && strings.Trim(code, " ") != "" {
					code = code[1 : len(code)-1]
				}
				b.WriteString("<code>" + html.EscapeString(code) + "</code>")
				i = end + n
				continue
			}
			text(s[i : i+n])
			i += n
			continue
		case c == '*' || c == '_':
			if out, next, ok := m.emphasis(s, i); ok {
				b.WriteString(out)
				i = next
				continue
			}
			n := runLen(s, i, c)
			text(s[i : i+n])
			i += n
			continue
		case c == '[':
			if out, next, ok := m.link(s, i); ok {
				b.WriteString(out)
				i = next
				continue
			}
		case c == '<':
			if end := strings.IndexByte(s[i:], '>'); end > 0 {
				dest := s[i+1 : i+end]
				if (strings.HasPrefix(dest, "http://") || strings.HasPrefix(dest, "https://")) && !strings.ContainsAny(dest, " \t\n<") {
					if href, ok := m.href(dest); ok {
						b.WriteString(`<a href="` + html.EscapeString(href) + `">` + html.EscapeString(dest) + "</a>")
						i += end + 1
						continue
					}
				}
			}
		}
		text(s[i : i+1])
		i++
	}
	return b.String()
}

func runLen(s string, i int, c byte) int {
	n := 0
	for i+n < len(s) && s[i+n] == c {
		n++
	}
	return n
}

// findRun returns the index of the next run of exactly n c's at or after i.
func findRun(s string, i int, c byte, n int) int {
	for i < len(s) {
		if s[i] != c {
			i++
			continue
		}
		k := runLen(s, i, c)
		if k == n {
			return i
		}
		i += k
	}
	return -1
}

// emphasis handles *em*, _em_, **strong** and __strong__. The opener must be
// followed by a non-space and the closer preceded by one; underscores must
// also sit at word boundaries, so snake_case names stay as they are.
func (m *markdown) emphasis(s string, i int) (string, int, bool) {
	c := s[i]
	n := runLen(s, i, c)
	if n > 2 {
		n = 2
	}
	if i+n >= len(s) || isSpace(s[i+n]) {
		return "", 0, false
	}
	if c == '_' && i > 0 && isAlnum(s[i-1]) {
		return "", 0, false
	}
	delim := strings.Repeat(string(c), n)
	for j := i + n + 1; j+n <= len(s); j++ {
		if s[j] == '`' { // code spans are opaque
			k := runLen(s, j, '`')
			if end := findRun(s, j+k, '`', k); end >= 0 {
				j = end + k - 1
			}
			continue
		}
		if s[j:j+n] != delim || isSpace(s[j-1]) {
			continue
		}
		if n == 1 && j+1 < len(s) && s[j+1] == c { // part of a longer run
			j++
			continue
		}
		if c == '_' && j+n < len(s) && isAlnum(s[j+n]) {
			continue
		}
		tag := "em"
		if n == 2 {
			tag = "strong"
		}
		return "<" + tag + ">" + m.inline(s[i+n:j]) + "</" + tag + ">", j + n, true
	}
	return "", 0, false
}

// link handles [text](dest) and [text](dest "title").
func (m *markdown) link(s string, i int) (string, int, bool) {
	depth := 0
	close := -1
	for j := i; j < len(s); j++ {
		switch s[j] {
		case '\\':
			j++
		case '`':
			k := runLen(s, j, '`')
			if end := findRun(s, j+k, '`', k); end >= 0 {
				j = end + k - 1
			}
		case '[':
			depth++
		case ']':
			depth--
		}
		if depth == 0 {
			close = j
			break
		}
	}
	if close < 0 || close+1 >= len(s) || s[close+1] != '(' {
		return "", 0, false
	}
	end := strings.IndexByte(s[close+1:], ')')
	if end < 0 {
		return "", 0, false
	}
	end += close + 1
	dest := strings.TrimSpace(s[close+2 : end])
	if k := strings.IndexAny(dest, " \t\n"); k >= 0 { // drop a title
		dest = dest[:k]
	}
	dest = strings.TrimSuffix(strings.TrimPrefix(dest, "<"), ">")
	label := m.inline(s[i+1 : close])
	href, ok := m.href(dest)
	if !ok {
		return "<span>" + label + "</span>", end + 1, true
	}
	return `<a href="` + html.EscapeString(href) + `">` + label + "</a>", end + 1, true
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
