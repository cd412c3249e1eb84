package image

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	dockerimage "github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"
)

// ErrNoDocker means no Docker engine answered; importing is skipped.
var ErrNoDocker = errors.New("no Docker engine reachable")

// DockerTag is the tag an image named name is imported under by default
// ("vertal/default:latest"), which the docker driver then uses.
func DockerTag(name string) string { return "vertal/" + name + ":latest" }

// DockerImport imports the image directory's rootfs into the Docker engine
// (DOCKER_HOST or the default socket) as tag, the API equivalent of
// `tar -C rootfs -c . | docker import - tag`. The interpreter versions go
// in as labels so a Docker-only host can still report them. It returns
// the new image ID, or an error wrapping ErrNoDocker when no engine
// answers.
func DockerImport(ctx context.Context, dir, tag string, v Versions) (string, error) {
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return "", fmt.Errorf("docker client: %w", err)
	}
	defer cli.Close()
	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = cli.Ping(pingCtx)
	cancel()
	if err != nil {
		return "", fmt.Errorf("%w at %s (%v)", ErrNoDocker, cli.DaemonHost(), err)
	}

	// The image the tag names now is removed after the import, unless a
	// container still uses it: rebuilding must not leave a trail of
	// untagged 250 MB images.
	var previous string
	if old, err := cli.ImageInspect(ctx, tag); err == nil {
		previous = old.ID
	}

	// Resolved first: a walk does not descend into a root that is a link
	// (dir/rootfs is one, to the current version).
	rootfs, err := filepath.EvalSymlinks(filepath.Join(dir, RootfsDir))
	if err != nil {
		return "", fmt.Errorf("docker import %s: %w", tag, err)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(WriteTar(pw, rootfs)) }()
	defer pr.Close()

	changes := []string{
		"ENV PATH=/usr/local/bin:/usr/bin:/bin",
		"ENV LANG=C.UTF-8",
		fmt.Sprintf("USER %d:%d", SandboxUID, SandboxGID),
		"WORKDIR /tmp",
		`CMD ["/bin/bash"]`,
		"LABEL io.vertal.python=" + v.Python,
		"LABEL io.vertal.javascript=" + v.JavaScript,
		"LABEL io.vertal.bash=" + v.Bash,
	}
	resp, err := cli.ImageImport(ctx, dockerimage.ImportSource{Source: pr, SourceName: "-"}, tag,
		dockerimage.ImportOptions{Changes: changes, Message: "vertal image build"})
	if err != nil {
		return "", fmt.Errorf("docker import %s: %w", tag, err)
	}
	defer resp.Close()
	id, err := readImportStream(resp)
	if err != nil {
		return "", fmt.Errorf("docker import %s: %w", tag, err)
	}
	if previous != "" && previous != id {
		// Fails harmlessly while a container or another tag uses it.
		cli.ImageRemove(ctx, previous, dockerimage.RemoveOptions{PruneChildren: true})
	}
	return id, nil
}

// readImportStream reads the engine's JSON message stream and returns the
// image ID it reports, or the error it reports.
func readImportStream(r io.Reader) (string, error) {
	dec := json.NewDecoder(r)
	var id string
	for {
		var msg struct {
			Status      string `json:"status"`
			Error       string `json:"error"`
			ErrorDetail struct {
				Message string `json:"message"`
			} `json:"errorDetail"`
		}
		if err := dec.Decode(&msg); err == io.EOF {
			break
		} else if err != nil {
			return "", fmt.Errorf("reading the engine's reply: %w", err)
		}
		if msg.Error != "" || msg.ErrorDetail.Message != "" {
			return "", errors.New(strings.TrimSpace(msg.Error + " " + msg.ErrorDetail.Message))
		}
		if strings.HasPrefix(msg.Status, "sha256:") {
			id = strings.TrimSpace(msg.Status)
		}
	}
	if id == "" {
		return "", errors.New("the engine reported no image ID")
	}
	return id, nil
}

// WriteTar writes the tree at root as a tar stream with numeric owners,
// modes, symlinks and hard links preserved (what `docker import` needs).
func WriteTar(w io.Writer, root string) error {
	tw := tar.NewWriter(w)
	type inode struct{ dev, ino uint64 }
	links := map[inode]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		var target string
		if info.Mode()&fs.ModeSymlink != 0 {
			if target, err = os.Readlink(path); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(info, target)
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		h.Name = filepath.ToSlash(rel)
		if info.IsDir() {
			h.Name += "/"
		}
		h.Uname, h.Gname = "", "" // numeric only: host names mean nothing here
		h.Format = tar.FormatPAX
		if st, ok := info.Sys().(*syscall.Stat_t); ok && info.Mode().IsRegular() && st.Nlink > 1 {
			key := inode{uint64(st.Dev), st.Ino}
			if first, seen := links[key]; seen {
				h.Typeflag, h.Linkname, h.Size = tar.TypeLink, first, 0
			} else {
				links[key] = h.Name
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		if h.Typeflag != tar.TypeReg {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		_, err = io.Copy(tw, f)
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}
