//go:build !linux

package sandbox

import (
	"errors"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
)

var errWorkdirLinux = errors.New("sandbox working directories need Linux")

// MountWorkdir needs Linux.
func MountWorkdir(dir string, l engine.Limits) error { return errWorkdirLinux }

// UnmountWorkdir needs Linux.
func UnmountWorkdir(dir string) error { return errWorkdirLinux }

// WriteCode needs Linux.
func WriteCode(dir, name string, code []byte) error { return errWorkdirLinux }

// PlaceFiles needs Linux.
func PlaceFiles(dir string, files []engine.File, uid uint32) error { return errWorkdirLinux }

// CollectFiles needs Linux.
func CollectFiles(dir string, globs []string, l engine.Limits) ([]engine.File, bool, error) {
	return nil, false, errWorkdirLinux
}
