package modeltest

// Behind PgBouncer in transaction pooling mode a client connection gets whichever server
// connection is free for each transaction, so nothing tied to a server session survives from
// one transaction to the next. Tests that prove idemgate works there (models) or notices what
// cannot work there (services: LISTEN) start a real pgbouncer (Debian's package;
// .ci/pgbouncer.sh installs it, and so does StartPgBouncer when missing and running as root).

import (
	"bytes"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"
)

// repoRoot is the module's root directory, found from this file's path so that any package's
// tests can run .ci scripts.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// must fails t at once on err.
func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// pgbouncerBin finds Debian's pgbouncer, running .ci/pgbouncer.sh (which installs it when we
// are root) if it is missing. It fails the test when pgbouncer cannot be had: never a skip.
func pgbouncerBin(t testing.TB) string {
	t.Helper()
	find := func() string {
		if p, err := exec.LookPath("pgbouncer"); err == nil {
			return p
		}
		if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
			return "/usr/sbin/pgbouncer"
		}
		return ""
	}
	if p := find(); p != "" {
		return p
	}
	out, err := exec.Command("bash", filepath.Join(repoRoot(), ".ci", "pgbouncer.sh")).CombinedOutput()
	p := find()
	if p == "" {
		t.Fatalf("pgbouncer is needed (Debian package pgbouncer) and could not be installed: %v\n%s", err, out)
	}
	return p
}

// PgBouncer is one running pgbouncer process in transaction pooling mode, started by
// StartPgBouncer.
type PgBouncer struct {
	host, port string
	log        *bytes.Buffer
}

// StartPgBouncer starts pgbouncer on a free loopback port in front of the PostgreSQL server of
// modeltest.AdminURL, in transaction pooling mode with poolSize server connections per
// database (few, so that client connections really share server connections), trust auth, and
// stops it when the test ends.
func StartPgBouncer(t testing.TB, poolSize int) *PgBouncer {
	t.Helper()
	bin := pgbouncerBin(t)
	admin, err := url.Parse(AdminURL())
	must(t, err)
	pgHost, pgPort := admin.Hostname(), admin.Port()
	if pgPort == "" {
		pgPort = "5432"
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	must(t, ln.Close())

	// pgbouncer refuses to run as root; -u drops to an unprivileged user after it has read its
	// files, so they stay private to us.
	dir, err := os.MkdirTemp("", "idemgate-pgbouncer-")
	must(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	users := filepath.Join(dir, "users.txt")
	// With trust auth pgbouncer checks no client, and logs in to PostgreSQL with the password of
	// the auth_file (TEST_DATABASE_URL's, if it has one).
	password, _ := admin.User.Password()
	must(t, os.WriteFile(users, fmt.Appendf(nil, "%q %q\n", admin.User.Username(), password), 0o600))
	ini := filepath.Join(dir, "pgbouncer.ini")
	must(t, os.WriteFile(ini, fmt.Appendf(nil, `[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %s
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
default_pool_size = %d
max_client_conn = 500
ignore_startup_parameters = extra_float_digits
`, pgHost, pgPort, port, users, poolSize), 0o600))

	args := []string{ini}
	if os.Geteuid() == 0 {
		name := "postgres"
		if _, err := user.Lookup(name); err != nil {
			name = "nobody"
		}
		args = append([]string{"-u", name}, args...)
	}
	var out bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	must(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	for range 100 {
		select {
		case err := <-done:
			t.Fatalf("pgbouncer exited at start: %v\n%s", err, out.String())
		default:
		}
		if c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", port), time.Second); err == nil {
			_ = c.Close()
			return &PgBouncer{host: "127.0.0.1", port: port, log: &out}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("pgbouncer does not listen on 127.0.0.1:%s\n%s", port, out.String())
	return nil
}

// Through returns dbURL with its host and port replaced by the pgbouncer's: the same database,
// reached through the pooler, with every other parameter as given.
func (b *PgBouncer) Through(t testing.TB, dbURL string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	must(t, err)
	u.Host = net.JoinHostPort(b.host, b.port)
	return u.String()
}
