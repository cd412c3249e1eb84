package agent

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"
)

// TestErrorCodesRoundTrip: what the agent's kernel says travels to the
// host as the contract's error, so the host can tell a full process table
// (fork at the pids limit) from a platform failure.
func TestErrorCodesRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want error
	}{
		{&os.SyscallError{Syscall: "fork/exec", Err: syscall.EAGAIN}, ErrAgain},
		{fmt.Errorf("open: %w", syscall.ENOENT), ErrNotExist},
		{syscall.EROFS, ErrReadOnly},
	} {
		m := errMsg(1, tc.err)
		if got := errorOf(m); !errors.Is(got, tc.want) {
			t.Errorf("%v: the host gets %v (code %q), want %v", tc.err, got, m.Err, tc.want)
		}
	}
}
