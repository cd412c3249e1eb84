package sandbox

import (
	"errors"
	"strings"
)

// CheckFilePath reports whether p is acceptable as the path of a file in
// the working directory: relative, slash-separated, clean, without "."
// or ".." parts, NUL or backslash.
func CheckFilePath(p string) error {
	switch {
	case p == "":
		return errors.New("is empty")
	case len(p) > 1024:
		return errors.New("is longer than 1024 bytes")
	case strings.HasPrefix(p, "/"):
		return errors.New("must be relative to the working directory")
	case strings.ContainsAny(p, "\x00\\"):
		return errors.New("must not contain NUL or backslash")
	}
	parts := strings.Split(p, "/")
	if len(parts) > 16 {
		return errors.New("is more than 16 directories deep")
	}
	for _, c := range parts {
		switch {
		case c == "":
			return errors.New("has an empty part (// or a trailing /)")
		case c == "." || c == "..":
			return errors.New(`must not contain "." or ".." parts`)
		case len(c) > 255:
			return errors.New("has a part longer than 255 bytes")
		}
	}
	return nil
}
