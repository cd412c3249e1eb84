package execution

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/image"
)

// images are the images requests may name, each with its languages.
type images struct {
	byName map[string]imageEntry
	names  []string // default first
	builds *buildIDs
}

type imageEntry struct {
	config.Image
	langs Languages
}

func newImages(list []config.Image) (images, error) {
	out := images{byName: map[string]imageEntry{}, builds: &buildIDs{byDir: map[string]buildID{}}}
	for _, img := range list {
		langs, err := NewLanguages(img.Languages)
		if err != nil {
			return images{}, err
		}
		out.byName[img.Name] = imageEntry{Image: img, langs: langs}
		out.names = append(out.names, img.Name)
	}
	return out, nil
}

// buildIDs remember the build id in each image directory's image.json,
// with the file it was read from. An execution records the build it
// resolved to, so every request looks; one stat tells whether image.json
// still resolves to the same file (vertal image update switches the
// image's current link to another version's), and only a change costs a
// read and parse of the manifest, which lists every installed package.
type buildIDs struct {
	mu    sync.Mutex
	byDir map[string]buildID
}

type buildID struct {
	file os.FileInfo
	id   string
}

// of returns the build id of the image at dir now, "" when it has no
// readable image.json (not built by vertal image build).
func (b *buildIDs) of(dir string) string {
	if dir == "" {
		return ""
	}
	fi, err := os.Stat(filepath.Join(dir, image.ManifestFile))
	if err != nil {
		return ""
	}
	b.mu.Lock()
	cached, ok := b.byDir[dir]
	b.mu.Unlock()
	if ok && os.SameFile(cached.file, fi) && cached.file.ModTime().Equal(fi.ModTime()) && cached.file.Size() == fi.Size() {
		return cached.id
	}
	m, err := image.ReadManifest(dir)
	if err != nil {
		return ""
	}
	b.mu.Lock()
	b.byDir[dir] = buildID{file: fi, id: m.Version}
	b.mu.Unlock()
	return m.Version
}

// ImageInfo is one image as GET /v1/images shows it.
type ImageInfo struct {
	Name string `json:"name"`
	// Version is the build's id; nil when the image was not built by
	// vertal image build (no image.json).
	Version   *string         `json:"version"`
	BuiltAt   *time.Time      `json:"built_at"`
	Languages []LanguageInfo  `json:"languages"`
	Packages  []image.Package `json:"packages"`
	// Tools are the command-line tools every built image carries
	// (image.Tools) that this one has installed.
	Tools []image.Tool `json:"tools"`
}

// lookupImage resolves a request's image for caller c: a name that is not
// configured is a bad request naming the ones that are; one the caller's
// plan does not include is forbidden.
func (s *Service) lookupImage(c Caller, name *string) (imageEntry, error) {
	n := config.DefaultImage
	if name != nil {
		n = strings.TrimSpace(*name)
	}
	img, ok := s.images.byName[n]
	if !ok {
		return imageEntry{}, Errorf(KindInvalidRequest, "image %q does not exist; use one of %s (see /v1/images)",
			clip(n, 40), strings.Join(s.ImageNames(c), ", "))
	}
	if !c.Plan.AllowsImage(n) {
		return imageEntry{}, Errorf(KindForbidden, "image %q is not available on plan %s; use one of %s (see /v1/images)",
			n, c.Key.Plan, strings.Join(s.ImageNames(c), ", "))
	}
	return img, nil
}

// ImageNames are the images c may use, default first.
func (s *Service) ImageNames(c Caller) []string {
	var out []string
	for _, n := range s.images.names {
		if c.Plan.AllowsImage(n) {
			out = append(out, n)
		}
	}
	return out
}

// Images lists the images c may use with their languages and main
// packages, read from each image's image.json now, so a rebuilt image
// shows its new version without a restart.
func (s *Service) Images(c Caller) []ImageInfo {
	out := []ImageInfo{}
	for _, n := range s.ImageNames(c) {
		img := s.images.byName[n]
		info := ImageInfo{Name: n, Languages: img.langs.List(), Packages: []image.Package{}, Tools: []image.Tool{}}
		if img.Dir != "" {
			if m, err := image.ReadManifest(img.Dir); err == nil {
				v, at := m.Version, m.BuiltAt
				info.Version, info.BuiltAt = &v, &at
				info.Packages = m.Main()
				info.Tools = m.Tools()
				info.Languages = withVersions(info.Languages, m.Languages)
			}
		}
		out = append(out, info)
	}
	return out
}

// withVersions sets the languages' versions from a fresh manifest.
func withVersions(ls []LanguageInfo, v image.Versions) []LanguageInfo {
	out := make([]LanguageInfo, len(ls))
	for i, l := range ls {
		if ver := v.ByLanguage(l.Name); ver != "" {
			l.Version = &ver
		}
		out[i] = l
	}
	return out
}
