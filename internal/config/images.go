package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/image"
)

// DefaultImage is the image a request that names none runs on.
const DefaultImage = "default"

// ImageConfig is one image, besides the default one, that requests may
// name with "image". Empty fields take the convention of
// `vertal image build --name NAME`.
type ImageConfig struct {
	// Dir is the image directory (rootfs/, versions.json, image.json);
	// default: NAME next to ImageDir.
	Dir string `json:"dir"`
	// DockerImage is its tag for the docker driver; default
	// vertal/NAME:latest.
	DockerImage string `json:"docker_image"`
}

// Image is one image resolved for the configured driver.
type Image struct {
	Name string
	Dir  string
	// Languages run on it: Language.Image is Dir/rootfs for oci and the
	// Docker tag for docker.
	Languages []engine.Language
}

// ImageDirOf is the directory of a configured image.
func (c Config) ImageDirOf(name string) string {
	if name == DefaultImage {
		return c.ImageDir
	}
	if d := c.Images[name].Dir; d != "" {
		return d
	}
	return filepath.Join(filepath.Dir(c.ImageDir), name)
}

// ImageNames are the configured images, default first, then by name.
func (c Config) ImageNames() []string {
	names := []string{DefaultImage}
	for n := range c.Images {
		if n != DefaultImage {
			names = append(names, n)
		}
	}
	sort.Strings(names[1:])
	return names
}

// ResolveImages resolves every configured image's languages. An image
// whose directory is missing is an error for the default image only
// (the server cannot run without it); any other one is left out and
// reported in skipped, so that a server starts while an image is built.
func (c Config) ResolveImages() (images []Image, skipped map[string]error, err error) {
	skipped = map[string]error{}
	for _, name := range c.ImageNames() {
		dir := c.ImageDirOf(name)
		docker := c.DockerImage
		if name != DefaultImage {
			docker = c.Images[name].DockerImage
			if docker == "" {
				docker = image.DockerTag(name)
			}
		}
		cc := c
		cc.ImageDir, cc.DockerImage = dir, docker
		if name != DefaultImage {
			// Per-language image overrides are for the default image.
			cc.Languages = map[string]LanguageOverride{}
			for l, o := range c.Languages {
				o.Image = ""
				cc.Languages[l] = o
			}
			if _, serr := fsStat(filepath.Join(dir, VersionsFile)); serr != nil && c.Driver != "docker" {
				skipped[name] = fmt.Errorf("image %s: %w (build it: vertal image build --name %s)", name, serr, name)
				continue
			}
		}
		langs, err := cc.ResolveLanguages()
		if err != nil {
			return nil, nil, fmt.Errorf("image %s: %w", name, err)
		}
		images = append(images, Image{Name: name, Dir: dir, Languages: langs})
	}
	return images, skipped, nil
}

func validateImages(c Config, bad func(string, ...any)) {
	for name, ic := range c.Images {
		if !image.NameRe.MatchString(name) {
			bad("image %q: want lower-case letters, digits, '-' and '_'", name)
		}
		if ic.Dir != "" && !filepath.IsAbs(ic.Dir) {
			bad("image %s: dir %q must be absolute", name, ic.Dir)
		}
	}
	for pname, p := range c.Plans {
		for _, n := range p.Images {
			if _, ok := c.Images[n]; !ok && n != DefaultImage {
				bad("plan %s: image %q is not configured (images: %s)", pname, n, strings.Join(c.ImageNames(), ", "))
			}
		}
	}
}

// AllowsImage reports whether a tenant on p may run on the image: every
// plan runs the default image; a plan without an image list runs every
// configured image.
func (p Plan) AllowsImage(name string) bool {
	if name == DefaultImage || len(p.Images) == 0 {
		return true
	}
	for _, n := range p.Images {
		if n == name {
			return true
		}
	}
	return false
}

var errNoImage = errors.New("not built")

func fsStat(path string) (fs.FileInfo, error) {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errNoImage
	}
	return fi, err
}
