package image

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// matplotlib needs a writable configuration and cache directory: without
// one it warns on stderr, makes a temporary one and rebuilds its font
// cache (seconds) on every run. A sandbox's only writable places are its
// fresh /tmp and /code, so an image with matplotlib gets its font cache
// built at build time (mplCacheDir) and a startup hook (a .pth file, which
// Python's site module runs) that, on the first `import matplotlib` only,
// points MPLCONFIGDIR at a directory in /tmp pre-filled with that cache
// and selects the Agg backend, unless the program set either itself.
const mplCacheDir = "/usr/local/share/vertal/matplotlib"

const mplHook = `# Installed by vertal image build; see internal/image/matplotlib.go.
import os, sys

class _VertalMatplotlib:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "matplotlib":
            return None
        try:
            sys.meta_path.remove(_VertalMatplotlib)
        except ValueError:
            pass
        os.environ.setdefault("MPLBACKEND", "Agg")
        if "MPLCONFIGDIR" not in os.environ:
            d = "/tmp/.matplotlib"
            try:
                os.makedirs(d, exist_ok=True)
                for f in os.listdir(%q):
                    dst = os.path.join(d, f)
                    if not os.path.exists(dst):
                        with open(os.path.join(%q, f), "rb") as i, open(dst, "wb") as o:
                            o.write(i.read())
                os.environ["MPLCONFIGDIR"] = d
            except OSError:
                pass
        return None

sys.meta_path.insert(0, _VertalMatplotlib)
`

// prepareMatplotlib does the above when rootfs has matplotlib; it reports
// whether it did.
func prepareMatplotlib(ctx context.Context, rootfs string) (bool, error) {
	if _, err := RunInRoot(ctx, rootfs, "/usr/bin/python3", "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('matplotlib') is None)"); err != nil {
		return false, nil
	}
	if err := os.MkdirAll(filepath.Join(rootfs, mplCacheDir), 0o755); err != nil {
		return false, err
	}
	// Building the font cache is what the first pyplot import does.
	if _, err := runInRootEnv(ctx, rootfs, []string{"MPLCONFIGDIR=" + mplCacheDir, "MPLBACKEND=Agg"},
		"/usr/bin/python3", "-c", "import matplotlib.pyplot, matplotlib.font_manager as f; f.fontManager.findfont('DejaVu Sans')"); err != nil {
		return false, fmt.Errorf("building the matplotlib font cache: %w", err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, mplCacheDir, "matplotlibrc"), []byte("backend: Agg\n"), 0o644); err != nil {
		return false, err
	}
	out, err := RunInRoot(ctx, rootfs, "/usr/bin/python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])")
	if err != nil {
		return false, err
	}
	site := filepath.Join(rootfs, "usr/local/lib/python"+strings.TrimSpace(out), "dist-packages")
	if err := os.MkdirAll(site, 0o755); err != nil {
		return false, err
	}
	if err := os.WriteFile(filepath.Join(site, "_vertal_matplotlib.py"), []byte(fmt.Sprintf(mplHook, mplCacheDir, mplCacheDir)), 0o644); err != nil {
		return false, err
	}
	if err := os.WriteFile(filepath.Join(site, "vertal-matplotlib.pth"), []byte("import _vertal_matplotlib\n"), 0o644); err != nil {
		return false, err
	}
	// Precompile the hook: the root is read-only in a sandbox.
	if _, err := RunInRoot(ctx, rootfs, "/usr/bin/python3", "-m", "py_compile", "/"+strings.TrimPrefix(strings.TrimPrefix(site, rootfs), "/")+"/_vertal_matplotlib.py"); err != nil {
		return false, err
	}
	return true, nil
}
