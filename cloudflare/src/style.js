// The site's style sheet, served at STYLE_PATH (a separate file, as the
// Content-Security-Policy allows no inline style).
export const STYLE = `:root { color-scheme: light dark; --fg: #1b1f24; --bg: #fff; --muted: #59636e; --line: #d1d9e0; --accent: #0b5cad; }
@media (prefers-color-scheme: dark) { :root { --fg: #e6edf3; --bg: #0d1117; --muted: #9198a1; --line: #30363d; --accent: #4493f8; } }
* { box-sizing: border-box; }
body { margin: 0; font: 16px/1.55 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); background: var(--bg); }
a { color: var(--accent); }
.top { display: flex; justify-content: space-between; align-items: center; padding: 0.8rem 1.5rem; border-bottom: 1px solid var(--line); }
.top nav a { margin-left: 1rem; }
.brand { font-weight: 700; text-decoration: none; color: var(--fg); }
main { max-width: 64rem; margin: 0 auto; padding: 1.5rem; }
.hero h1 { font-size: 2rem; line-height: 1.2; }
.button { display: inline-block; padding: 0.45rem 1rem; border-radius: 6px; background: var(--accent); color: #fff; text-decoration: none; }
pre { overflow-x: auto; padding: 1rem; border: 1px solid var(--line); border-radius: 6px; }
code { font: 0.9em ui-monospace, SFMono-Regular, Menlo, monospace; }
.scroll { overflow-x: auto; }
table.plans { border-collapse: collapse; width: 100%; }
table.plans th, table.plans td { padding: 0.45rem 0.6rem; border-bottom: 1px solid var(--line); text-align: right; white-space: nowrap; }
table.plans th[scope=row], table.plans thead th:first-child { text-align: left; }
footer { max-width: 64rem; margin: 2rem auto; padding: 0 1.5rem; color: var(--muted); font-size: 0.9rem; }
`;
