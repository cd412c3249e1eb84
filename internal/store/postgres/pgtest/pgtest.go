// Package pgtest gives a test an empty PostgreSQL database of its own on
// the server at VERTAL_TEST_DATABASE_URL (whose role needs CREATEDB).
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvVar names the administrative database URL; CI always sets it.
const EnvVar = "VERTAL_TEST_DATABASE_URL"

// NewDatabase creates an empty database for one test, drops it when the
// test ends, and returns its URL. The test fails if EnvVar is not set:
// callers that may run without PostgreSQL check it first.
func NewDatabase(t testing.TB) string {
	t.Helper()
	admin := os.Getenv(EnvVar)
	if admin == "" {
		t.Fatal(EnvVar + " is not set (scripts/postgres.sh prints one)")
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	name := "vertal_test_" + hex.EncodeToString(b)

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("connecting to %s: %v", EnvVar, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("creating a test database: %v", err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Errorf("dropping the test database: %v", err)
			return
		}
		defer conn.Close(ctx)
		// FORCE cannot end a backend of another role, such as an
		// autovacuum worker that happens to be in the new database
		// (SQLSTATE 42501); those finish quickly, so try again.
		for i := 0; ; i++ {
			_, err := conn.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)")
			if err == nil {
				break
			}
			if i == 50 {
				t.Errorf("dropping the test database: %v", err)
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	})

	if strings.HasPrefix(admin, "postgres://") || strings.HasPrefix(admin, "postgresql://") {
		u, err := url.Parse(admin)
		if err != nil {
			t.Fatalf("parsing %s: %v", EnvVar, err)
		}
		u.Path = "/" + name
		return u.String()
	}
	return admin + " dbname=" + name // keyword=value form
}
