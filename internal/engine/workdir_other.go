//go:build !linux

package engine

import "errors"

var errWorkdirLinux = errors.New("sandbox working directories need Linux")

// MountWorkdir needs Linux.
func MountWorkdir(dir string, l Limits) error { return errWorkdirLinux }

// UnmountWorkdir needs Linux.
func UnmountWorkdir(dir string) error { return errWorkdirLinux }

// WriteCode needs Linux.
func WriteCode(dir, name string, code []byte) error { return errWorkdirLinux }

// PlaceFiles needs Linux.
func PlaceFiles(dir string, files []File, uid uint32) error { return errWorkdirLinux }

// CollectFiles needs Linux.
func CollectFiles(dir string, globs []string, l Limits) ([]File, bool, error) {
	return nil, false, errWorkdirLinux
}
