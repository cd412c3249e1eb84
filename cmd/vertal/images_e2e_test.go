package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"image/png"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/kuboprotocol/vertal2kubo/internal/e2etest"
)

// chartCode reads the CSV with pandas and draws it with matplotlib into
// chart.png, 400x300 pixels (4x3 inches at 100 dpi).
const chartCode = `import pandas as pd
import matplotlib.pyplot as plt
df = pd.read_csv("sales.csv")
ax = df.plot(x="month", y="units", kind="bar", figsize=(4, 3), legend=False)
ax.set_title("units by month")
plt.tight_layout()
plt.savefig("chart.png", dpi=100)
print(int(df["units"].sum()))
`

const salesCSV = "month,units\njan,10\nfeb,25\nmar,17\n"

func chartRequest() map[string]any {
	return map[string]any{"image": "datasci", "language": "python", "code": chartCode,
		"files":        []map[string]any{{"path": "sales.csv", "content": salesCSV}},
		"return_files": []string{"*.png"}, "timeout_s": 30}
}

// checkPNG decodes b as a PNG of 400x300.
func checkPNG(t *testing.T, b []byte) {
	t.Helper()
	cfg, err := png.DecodeConfig(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("returned chart is not a PNG: %v", err)
	}
	if cfg.Width != 400 || cfg.Height != 300 {
		t.Errorf("chart is %dx%d, want 400x300", cfg.Width, cfg.Height)
	}
}

// checkDatasci runs what the datasci image promises through the API: the
// chart from a CSV comes back as a PNG, with nothing on stderr (no
// matplotlib cache warning: the font cache was built with the image); an
// npm package loads with require; the image is listed with its packages;
// an unknown image is a 400 naming the images.
func checkDatasci(t *testing.T, p *serverProc, key string) {
	r := call(t, "POST", p.url+"/v1/executions", key, chartRequest(), nil)
	if r.status != 200 || r.body["status"] != "succeeded" || r.body["stdout"] != "52\n" || r.body["stderr"] != "" {
		t.Fatalf("chart run: %d %s", r.status, tail(r.raw, 2000))
	}
	files, _ := r.body["files"].([]any)
	if len(files) != 1 {
		t.Fatalf("files: %v", r.body["files"])
	}
	f := files[0].(map[string]any)
	b, err := base64.StdEncoding.DecodeString(fmt.Sprint(f["content"]))
	if err != nil || f["path"] != "chart.png" {
		t.Fatalf("returned file %v: %v", f["path"], err)
	}
	checkPNG(t, b)
	// The execution names the image and the build it ran on, in the answer
	// and when read back.
	want := []any{"datasci", imageVersion(t, p.url, key, "datasci")}
	if want[1] == nil {
		t.Errorf("GET /v1/images shows no version for the built datasci image")
	}
	got := call(t, "GET", p.url+"/v1/executions/"+fmt.Sprint(r.body["id"]), key, nil, nil)
	for what, body := range map[string]map[string]any{"POST": r.body, "GET": got.body} {
		if g := []any{body["image"], body["image_version"]}; !cmp.Equal(want, g) {
			t.Errorf("%s: image, image_version = %v, want %v", what, g, want)
		}
	}

	r = call(t, "POST", p.url+"/v1/executions", key, map[string]any{"image": "datasci", "language": "javascript",
		"code": `const _ = require("lodash"); const dayjs = require("dayjs"); console.log(_.sum([1, 2, 3]), dayjs("2024-02-03").format("DD/MM"))`}, nil)
	if r.status != 200 || r.body["stdout"] != "6 03/02\n" {
		t.Errorf("npm packages: %d %s", r.status, tail(r.raw, 1000))
	}
	// The default image has neither.
	r = call(t, "POST", p.url+"/v1/executions", key, map[string]any{"language": "python", "code": "import pandas"}, nil)
	if r.status != 200 || r.body["status"] != "failed" || !strings.Contains(fmt.Sprint(r.body["stderr"]), "No module named 'pandas'") {
		t.Errorf("pandas on the default image: %d %s", r.status, tail(r.raw, 1000))
	}

	r = call(t, "GET", p.url+"/v1/images", key, nil, nil)
	if r.status != 200 || !strings.Contains(r.raw, `"name":"datasci"`) || !strings.Contains(r.raw, `"python3-pandas"`) || !strings.Contains(r.raw, `"lodash"`) {
		t.Errorf("GET /v1/images: %d %s", r.status, tail(r.raw, 2000))
	}
	r = call(t, "POST", p.url+"/v1/executions", key, map[string]any{"image": "nope", "language": "python", "code": "1"}, nil)
	if r.status != 400 || r.code() != "invalid_request" || !strings.Contains(r.raw, "default, datasci") {
		t.Errorf("unknown image: %d %s", r.status, r.raw)
	}
}

// imageVersion is the version GET /v1/images shows for image name: a
// string, or nil for an image not built by vertal image build.
func imageVersion(t *testing.T, base, key, name string) any {
	t.Helper()
	r := call(t, "GET", base+"/v1/images", key, nil, nil)
	images, _ := r.body["images"].([]any)
	for _, img := range images {
		if m, _ := img.(map[string]any); m["name"] == name {
			return m["version"]
		}
	}
	t.Fatalf("GET /v1/images: no image %q: %d %s", name, r.status, tail(r.raw, 1000))
	return nil
}

// TestDatasciE2E: the datasci image through the API on oci+crun and on
// docker+runc, and the chart once through MCP, where it comes back as
// image content.
func TestDatasciE2E(t *testing.T) {
	needE2E(t)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"oci-crun", []string{"--driver", "oci", "--runtime", "crun"}},
		{"docker-runc", []string{"--driver", "docker", "--runtime", "runc"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--dev", "--image", "datasci=" + e2etest.DatasciDir()}, tc.args...)
			p := startServer(t, t.TempDir(), nil, args...)
			checkDatasci(t, p, p.devKey)
			if tc.name == "oci-crun" {
				t.Run("MCP", func(t *testing.T) { checkChartMCP(t, p, p.devKey) })
			}
		})
	}
}

type bearer struct{ key string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return http.DefaultTransport.RoundTrip(r)
}

// checkChartMCP draws the chart with run_code over the server's /mcp: the
// tool description names the datasci image and pandas, and the PNG comes
// back as image content.
func checkChartMCP(t *testing.T, p *serverProc, key string) {
	ctx := context.Background()
	c := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: p.url + "/mcp",
		HTTPClient: &http.Client{Transport: bearer{key}}, DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var desc string
	for _, tl := range tools.Tools {
		if tl.Name == "run_code" {
			desc = tl.Description
		}
	}
	if !strings.Contains(desc, "datasci (") || !strings.Contains(desc, "python3-pandas") {
		t.Errorf("run_code description does not list datasci and its packages:\n%s", desc)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_code", Arguments: chartRequest()})
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError {
		t.Fatalf("run_code failed: %+v", res.Content)
	}
	found := false
	for _, c := range res.Content {
		if img, ok := c.(*mcp.ImageContent); ok {
			found = true
			if img.MIMEType != "image/png" {
				t.Errorf("image content type %q", img.MIMEType)
			}
			checkPNG(t, img.Data)
		}
	}
	if !found {
		t.Errorf("no image content in %+v", res.Content)
	}
}
