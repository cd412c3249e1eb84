package web

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func testResolver(dest string) (string, bool) {
	known := map[string]string{"SECURITY.MD": "security", "API.MD": "api"}
	s := &site{opts: Options{RepoURL: "https://example.test/repo"}}
	return s.resolveLink(dest, known)
}

func TestRenderMarkdown(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"paragraph", "Hello  world\nnext line", "<p>Hello  world\nnext line</p>\n"},
		{"heading ids", "# Title\n## Two words\n## Two words", `<h1 id="title">Title</h1>` + "\n" + `<h2 id="two-words">Two words</h2>` + "\n" + `<h2 id="two-words-1">Two words</h2>` + "\n"},
		{"heading closing hashes", "## Keys ##", `<h2 id="keys">Keys</h2>` + "\n"},
		{"hashtag is not a heading", "#tag", "<p>#tag</p>\n"},
		{"raw html is escaped", `<script>alert(1)</script>`, "<p>&lt;script&gt;alert(1)&lt;/script&gt;</p>\n"},
		{"img onerror escaped", `<img src=x onerror="alert(1)">`, "<p>&lt;img src=x onerror=&quot;alert(1)&quot;&gt;</p>\n"},
		{"entities escaped", `a & b < c > d "e" 'f'`, "<p>a &amp; b &lt; c &gt; d &quot;e&quot; 'f'</p>\n"},
		{"inline code escaped", "run `<b>&amp;</b>` now", "<p>run <code>&lt;b&gt;&amp;amp;&lt;/b&gt;</code> now</p>\n"},
		{"double backtick code", "``a ` b``", "<p><code>a ` b</code></p>\n"},
		{"unclosed backtick", "a ` b", "<p>a ` b</p>\n"},
		{"strong and em", "**bold** and *em* and _em_", "<p><strong>bold</strong> and <em>em</em> and <em>em</em></p>\n"},
		{"snake_case untouched", "exit_code and sandbox_seconds", "<p>exit_code and sandbox_seconds</p>\n"},
		{"spaced asterisks untouched", "print(6 * 7) * 2", "<p>print(6 * 7) * 2</p>\n"},
		{"escaped punctuation", `\*not em\* and \<b\>`, "<p>*not em* and &lt;b&gt;</p>\n"},
		{"code inside strong", "**`x<y`**", "<p><strong><code>x&lt;y</code></strong></p>\n"},
		{"http link", "[site](https://example.com/a?b=1&c=2)", `<p><a href="https://example.com/a?b=1&amp;c=2">site</a></p>` + "\n"},
		{"link text escaped", "[<i>x</i>](https://e.test)", `<p><a href="https://e.test">&lt;i&gt;x&lt;/i&gt;</a></p>` + "\n"},
		{"quote in href escaped", `[x](https://e.test/"onmouseover=alert(1))`, `<p><a href="https://e.test/&#34;onmouseover=alert(1)">x</a></p>` + "\n"},
		{"javascript link dropped", "[click](javascript:alert(1))", "<p><span>click</span></p>\n"},
		{"javascript upper-case dropped", "[click](JaVaScRiPt:alert`1`)", "<p><span>click</span></p>\n"},
		{"data link dropped", "[x](data:text/html;base64,PHNjcmlwdD4=)", "<p><span>x</span></p>\n"},
		{"vbscript dropped", "[x](vbscript:msgbox)", "<p><span>x</span></p>\n"},
		{"protocol-relative dropped", "[x](//evil.test/a)", "<p><span>x</span></p>\n"},
		{"anchor link", "[keys](#keys)", `<p><a href="#keys">keys</a></p>` + "\n"},
		{"doc link resolved", "[security](SECURITY.md#keys)", `<p><a href="/docs/security#keys">security</a></p>` + "\n"},
		{"dot doc link resolved", "[api](./API.md)", `<p><a href="/docs/api">api</a></p>` + "\n"},
		{"repo file link", "[engine](../internal/engine/engine.go)", `<p><a href="https://example.test/repo/blob/main/internal/engine/engine.go">engine</a></p>` + "\n"},
		{"link escaping the repo dropped", "[x](../../etc/passwd)", "<p><span>x</span></p>\n"},
		{"site path kept", "[playground](/)", `<p><a href="/">playground</a></p>` + "\n"},
		{"autolink", "<https://example.com>", `<p><a href="https://example.com">https://example.com</a></p>` + "\n"},
		{"fenced code escaped", "```html\n<script>x</script>\n  & more\n```", `<pre><code class="language-html">&lt;script&gt;x&lt;/script&gt;` + "\n  &amp; more\n</code></pre>\n"},
		{"fence info sanitised", "```\"><script>\nx\n```", "<pre><code class=\"language-script\">x\n</code></pre>\n"},
		{"unclosed fence runs to end", "```\na\nb", "<pre><code>a\nb\n</code></pre>\n"},
		{"tilde fence", "~~~\n```\n~~~", "<pre><code>```\n</code></pre>\n"},
		{"bullet list", "- one\n- two `2`\n* other", "<ul>\n<li>one</li>\n<li>two <code>2</code></li>\n</ul>\n<ul>\n<li>other</li>\n</ul>\n"},
		{"nested list", "- a\n  - b\n- c", "<ul>\n<li>a\n<ul>\n<li>b</li>\n</ul>\n</li>\n<li>c</li>\n</ul>\n"},
		{"ordered list start", "3. c\n4. d", "<ol start=\"3\">\n<li>c</li>\n<li>d</li>\n</ol>\n"},
		{"loose list", "- a\n\n- b", "<ul>\n<li>\n<p>a</p>\n</li>\n<li>\n<p>b</p>\n</li>\n</ul>\n"},
		{"list item with code", "1. Run:\n\n   ```sh\n   vertal serve\n   ```\n2. Next", "<ol>\n<li>\n<p>Run:</p>\n<pre><code class=\"language-sh\">vertal serve\n</code></pre>\n</li>\n<li>\n<p>Next</p>\n</li>\n</ol>\n"},
		{"blockquote", "> **Note** <b>", "<blockquote>\n<p><strong>Note</strong> &lt;b&gt;</p>\n</blockquote>\n"},
		{"rule", "a\n\n---\n\nb", "<p>a</p>\n<hr>\n<p>b</p>\n"},
		{"table", "| a | b |\n|---|--:|\n| `x\\|y` | <i> |", "<div class=\"table-wrap\"><table>\n<thead>\n<tr>\n<th>a</th>\n<th class=\"align-right\">b</th>\n</tr>\n</thead>\n<tbody>\n<tr>\n<td><code>x|y</code></td>\n<td class=\"align-right\">&lt;i&gt;</td>\n</tr>\n</tbody>\n</table></div>\n"},
		{"number in prose is not a list", "It was\n2024. A year.", "<p>It was\n2024. A year.</p>\n"},
		{"crlf", "a\r\nb", "<p>a\nb</p>\n"},
		{"html block escaped", "<div onclick=\"x()\">\n<b>hi</b>\n</div>", "<p>&lt;div onclick=&quot;x()&quot;&gt;\n&lt;b&gt;hi&lt;/b&gt;\n&lt;/div&gt;</p>\n"},
		{"html comment escaped", "<!-- note -->", "<p>&lt;!-- note --&gt;</p>\n"},
		{"image is a link", "![chart](https://e.test/c.png)", `<p><a href="https://e.test/c.png">chart</a></p>` + "\n"},
		{"javascript image dropped", "![x](javascript:alert(1))", "<p><span>x</span></p>\n"},
		{"email autolink", "<ops@example.com>", `<p><a href="mailto:ops@example.com">ops@example.com</a></p>` + "\n"},
		{"javascript autolink dropped", "<javascript:alert(1)>", "<p><span>javascript:alert(1)</span></p>\n"},
		{"heading with code", "## The `run` call", `<h2 id="the-run-call">The <code>run</code> call</h2>` + "\n"},
		{"table alignments are classes", "| l | c |\n|:--|:-:|\n| 1 | 2 |", "<div class=\"table-wrap\"><table>\n<thead>\n<tr>\n<th class=\"align-left\">l</th>\n<th class=\"align-center\">c</th>\n</tr>\n</thead>\n<tbody>\n<tr>\n<td class=\"align-left\">1</td>\n<td class=\"align-center\">2</td>\n</tr>\n</tbody>\n</table></div>\n"},
		{"invalid utf-8 passes as text", "a\xffb <", "<p>a\xffb &lt;</p>\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := string(renderMarkdown(tc.in, testResolver).HTML)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("renderMarkdown(%q) (-want +got):\n%s", tc.in, diff)
			}
		})
	}
}

func TestRenderMarkdownTitleAndHeadings(t *testing.T) {
	d := renderMarkdown("# Vertal *Run*\n\n## First `step`\n\n### Detail\n\n# Second title", nil)
	if d.Title != "Vertal Run" {
		t.Errorf("Title = %q, want %q", d.Title, "Vertal Run")
	}
	want := []heading{
		{Level: 1, ID: "vertal-run", Text: "Vertal Run"},
		{Level: 2, ID: "first-step", Text: "First step"},
		{Level: 3, ID: "detail", Text: "Detail"},
		{Level: 1, ID: "second-title", Text: "Second title"},
	}
	if diff := cmp.Diff(want, d.Headings); diff != "" {
		t.Errorf("Headings (-want +got):\n%s", diff)
	}
}

// TestRenderMarkdownNeverEmitsMarkupFromText feeds hostile snippets through
// every construct and checks that no tag or attribute outside the renderer's
// own vocabulary appears.
func TestRenderMarkdownNeverEmitsMarkupFromText(t *testing.T) {
	payloads := []string{
		`<script>alert(1)</script>`,
		`<img src=x onerror=alert(1)>`,
		`"><svg onload=alert(1)>`,
		`javascript:alert(1)`,
		"\x1b[31mred\x1b[0m",
		"<a href='javascript:alert(1)'>x</a>",
		"<style>body{display:none}</style>",
		"<iframe srcdoc='<script>alert(1)</script>'>",
	}
	wrappers := []string{
		"%s", "# %s", "- %s", "1. %s", "> %s", "**%s**", "*%s*", "`%s`", "[%s](https://e.test)",
		"[x](%s)", "| %s | b |\n|---|---|\n| %s | c |", "```\n%s\n```", "```%s\nx\n```", "<%s>",
	}
	allowed := map[string]bool{
		"p": true, "h1": true, "h2": true, "h3": true, "h4": true, "h5": true, "h6": true, "ul": true, "ol": true,
		"li": true, "blockquote": true, "pre": true, "code": true, "strong": true, "em": true, "a": true, "span": true,
		"hr": true, "table": true, "thead": true, "tbody": true, "tr": true, "th": true, "td": true, "div": true,
	}
	for _, p := range payloads {
		for _, w := range wrappers {
			src := strings.ReplaceAll(w, "%s", p)
			out := string(renderMarkdown(src, testResolver).HTML)
			for _, tag := range reTags.FindAllString(out, -1) {
				name := strings.TrimPrefix(strings.Fields(strings.Trim(tag, "<>/"))[0], "/")
				if !allowed[name] {
					t.Errorf("render(%q) produced tag %s:\n%s", src, tag, out)
				}
				lower := strings.ToLower(tag)
				if strings.Contains(lower, " on") || strings.Contains(lower, "javascript:") || strings.Contains(lower, "style=") {
					t.Errorf("render(%q) produced attribute in %s", src, tag)
				}
			}
		}
	}
}
