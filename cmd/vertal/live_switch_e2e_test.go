package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/image"
	"github.com/kuboprotocol/vertal2kubo/internal/image/imagetest"
)

// buildLive builds image "live" in imagesDir from the default image with
// a wheel of the given version, through the command.
func buildLive(t *testing.T, imagesDir, version string) {
	t.Helper()
	wh := t.TempDir()
	imagetest.WriteWheel(t, wh, "vertal_live", version, "VERSION = "+`"`+version+`"`+"\n")
	out, err := exec.Command(vertalBinary(t), "image", "build", "--name", "live", "--images-dir", imagesDir,
		"--from", imageDir(), "--apt", "python3-pip", "--pip-wheelhouse", wh, "--docker-tag", "").CombinedOutput()
	if err != nil {
		t.Fatalf("image build: %v\n%s", err, out)
	}
}

// newLiveImage builds version 1.0 of image "live" in a new images
// directory, and returns that directory and the image's.
func newLiveImage(t *testing.T) (imagesDir, dir string) {
	t.Helper()
	imagesDir = t.TempDir()
	// The default runtime (bwrap) resolves the image as the sandbox's
	// uid: t.TempDir's parent is 0700.
	if err := os.Chmod(filepath.Dir(imagesDir), 0o711); err != nil {
		t.Fatal(err)
	}
	buildLive(t, imagesDir, "1.0")
	return imagesDir, filepath.Join(imagesDir, "live")
}

// TestLiveImageSwitchE2E replaces an image while executions run on it:
// none fails, each sees the version it started on for its whole run, a
// run started after the switch sees the new one, and the old version is
// deleted once nothing runs on it (gc), not before.
func TestLiveImageSwitchE2E(t *testing.T) {
	needE2E(t)
	imagesDir, dir := newLiveImage(t)
	first := image.CurrentVersion(dir)
	p := startServer(t, t.TempDir(), nil, "--dev", "--image", "live="+dir, "--pool-max", "0")

	// Each run imports the module at the start and again after 4 s,
	// reading its file from the root both times.
	code := "import time, importlib, vertal_live\na = vertal_live.VERSION\ntime.sleep(4)\nimportlib.reload(vertal_live)\nprint(a, vertal_live.VERSION)\n"
	const n = 3
	var wg sync.WaitGroup
	results := make([]httpResult, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = call(t, "POST", p.url+"/v1/executions", p.devKey, map[string]any{"image": "live", "language": "python", "code": code, "timeout_s": 30}, nil)
		}()
	}
	time.Sleep(1500 * time.Millisecond) // the runs have started
	buildLive(t, imagesDir, "2.0")
	second := image.CurrentVersion(dir)
	if second == first {
		t.Fatal("the rebuild did not switch the version")
	}
	wg.Wait()
	for i, r := range results {
		if r.status != 200 || r.body["status"] != "succeeded" || r.body["stdout"] != "1.0 1.0\n" {
			t.Errorf("run %d across the switch: %d %s", i, r.status, tail(r.raw, 800))
		}
		// Each execution records the build it was accepted on.
		if r.body["image"] != "live" || r.body["image_version"] != first {
			t.Errorf("run %d across the switch recorded image %v build %v, want live %s", i, r.body["image"], r.body["image_version"], first)
		}
	}
	r := call(t, "POST", p.url+"/v1/executions", p.devKey, map[string]any{"image": "live", "language": "python", "code": "import vertal_live; print(vertal_live.VERSION)"}, nil)
	if r.body["stdout"] != "2.0\n" {
		t.Errorf("run after the switch: %d %s", r.status, tail(r.raw, 800))
	}
	if r.body["image"] != "live" || r.body["image_version"] != second {
		t.Errorf("run after the switch recorded image %v build %v, want live %s", r.body["image"], r.body["image_version"], second)
	}
	r = call(t, "GET", p.url+"/v1/images", p.devKey, nil, nil)
	if !strings.Contains(r.raw, `"version":"`+second+`"`) {
		t.Errorf("GET /v1/images does not show the new version %s: %s", second, tail(r.raw, 1500))
	}
	// Nothing runs on the first version now: a gc without grace deletes it.
	out, err := exec.Command(vertalBinary(t), "image", "gc", "--images-dir", imagesDir, "--grace", "0s", "live").CombinedOutput()
	if err != nil {
		t.Fatalf("image gc: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, image.VersionsSubdir, first)); !os.IsNotExist(err) {
		t.Errorf("the unused old version %s is still there (%v): %s", first, err, out)
	}
}

// TestWarmPoolAfterImageSwitchE2E: with the warm pool on, a sandbox warmed
// on an image's old build is not handed out once a rebuild switched the
// image: the next execution runs on the new build, and the pool counts
// the sandbox it dropped.
func TestWarmPoolAfterImageSwitchE2E(t *testing.T) {
	needE2E(t)
	imagesDir, dir := newLiveImage(t)
	p := startServer(t, t.TempDir(), nil, "--dev", "--image", "live="+dir, "--metrics-addr", "127.0.0.1:0", "--pool-min", "1", "--pool-max", "2")
	scrape := metricsOf(t, p)
	metric := func(name string) float64 { return scrape(name + `{language="python"}`) }
	runLive := func() httpResult {
		return call(t, "POST", p.url+"/v1/executions", p.devKey, map[string]any{"image": "live", "language": "python", "code": "import vertal_live; print(vertal_live.VERSION)"}, nil)
	}
	// A first run on live misses and makes the pool warm one for live, as
	// well as the default image's.
	if r := runLive(); r.body["stdout"] != "1.0\n" {
		t.Fatalf("first run: %d %s", r.status, tail(r.raw, 800))
	}
	for deadline := time.Now().Add(time.Minute); metric("vertal_pool_ready") < 2; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no warm sandbox for live within a minute (ready %v)", metric("vertal_pool_ready"))
		}
	}
	hits := metric("vertal_pool_hits_total")
	buildLive(t, imagesDir, "2.0")
	r := runLive()
	if r.body["stdout"] != "2.0\n" || r.body["image_version"] != image.CurrentVersion(dir) {
		t.Errorf("run after the switch: %d %s", r.status, tail(r.raw, 800))
	}
	if n := metric("vertal_pool_outdated_total"); n != 1 {
		t.Errorf("vertal_pool_outdated_total = %v; want the one sandbox warmed on 1.0", n)
	}
	// From the new build's own warm sandbox, as before the switch.
	for deadline := time.Now().Add(time.Minute); metric("vertal_pool_ready") < 2; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the pool did not refill for live within a minute")
		}
	}
	if r := runLive(); r.body["stdout"] != "2.0\n" || metric("vertal_pool_hits_total") <= hits {
		t.Errorf("run on the refilled pool: %s (hits %v, before %v)", tail(r.raw, 800), metric("vertal_pool_hits_total"), hits)
	}
}
