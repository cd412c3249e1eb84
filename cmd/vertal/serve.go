package main

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/kuboprotocol/vertal2kubo/client"
	"github.com/kuboprotocol/vertal2kubo/internal/account"
	"github.com/kuboprotocol/vertal2kubo/internal/api"
	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/docker"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/oci"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/pool"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/kuboprotocol/vertal2kubo/internal/image"
	"github.com/kuboprotocol/vertal2kubo/internal/lang"
	"github.com/kuboprotocol/vertal2kubo/internal/mcpserver"
	"github.com/kuboprotocol/vertal2kubo/internal/queue"
	"github.com/kuboprotocol/vertal2kubo/internal/sandbox/uidpool"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
	"github.com/kuboprotocol/vertal2kubo/internal/store/postgres"
	"github.com/kuboprotocol/vertal2kubo/internal/store/sqlite"
	"github.com/kuboprotocol/vertal2kubo/internal/web"
	"github.com/kuboprotocol/vertal2kubo/internal/webhook"
)

// devTenant is the tenant `serve --dev` creates.
const devTenant = "local"

func cmdServe(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("vertal serve", flag.ContinueOnError)
	fs.SetOutput(e.Stderr)
	fs.Usage = func() {
		fmt.Fprintln(e.Stderr, "usage: vertal serve [flags]\n\nStarts the API. Every flag can also be set with the VERTAL_* variable shown, or in the --config file.\n\nflags:")
		fs.PrintDefaults()
	}
	b := config.Bind(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	cfg, err := b.Resolve(e.Getenv)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewJSONHandler(e.Stderr, nil))
	return serve(ctx, e, cfg, logger)
}

// parseFlags parses fs, turning -h into a clean exit and a bad flag into
// exit status 2 (the flag package has printed why).
func parseFlags(fs *flag.FlagSet, args []string) error {
	err := fs.Parse(args)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		return exitCode(0)
	default:
		return exitCode(2)
	}
}

func serve(ctx context.Context, e *env, cfg config.Config, logger *slog.Logger) error {
	st, storeDesc, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer st.Close()

	driver, pre, closeDriver, err := newDriver(ctx, cfg, cfg.StateDir, logger)
	if err != nil {
		return err
	}
	defer closeDriver()
	if n, err := driver.Reap(ctx); err != nil {
		logger.Warn("removing sandboxes left by an earlier run", "error", err)
	} else if n > 0 {
		logger.Info("removed sandboxes left by an earlier run", "count", n)
	}
	// With their sandboxes gone, the uid leases a crashed server held
	// return to the host-wide pool.
	if n, err := reapUIDLeases(); err != nil {
		logger.Warn("releasing uid leases left by an earlier run", "error", err)
	} else if n > 0 {
		logger.Info("released uid leases left by an earlier run", "count", n)
	}

	images, skipped, err := cfg.ResolveImages()
	if err != nil {
		return err
	}
	for name, err := range skipped {
		logger.Warn("image not offered", "image", name, "error", err)
	}
	langs := images[0].Languages
	if cfg.Driver == "oci" {
		go collectImageVersions(ctx, images, logger)
	}
	for _, l := range langs {
		if l.Version == "" {
			logger.Warn("language version unknown; /v1/languages reports null", "language", l.Name,
				"versions_file", filepath.Join(cfg.ImageDir, config.VersionsFile))
		}
	}

	metrics := api.NewMetrics()
	runner := driver
	if cfg.PoolMax > 0 {
		p := pool.New(driver, pre, pool.Options{
			Min:         cfg.PoolMin,
			Max:         cfg.PoolMax,
			MemoryBytes: int64(cfg.PoolMemoryMB) << 20,
			Languages:   langs,
			Limits:      engine.Limits{MemoryBytes: cfg.Plans[cfg.PoolPlan].MemoryBytes()},
			Logger:      logger,
		})
		// Deferred after closeDriver, so it runs first: warm sandboxes are
		// destroyed while the driver can still do it.
		defer p.Close()
		metrics.Add(p)
		runner = p
	}
	eng := engine.New(runner, engine.Options{MaxConcurrent: cfg.MaxConcurrent, QueueTimeout: cfg.QueueTimeout.D(), MaxQueue: cfg.MaxQueue})

	// The MCP tools call the execution service of the API server directly,
	// as the caller the API authenticated; the API handler exists only
	// after api.New, which needs the MCP handler, hence the indirection.
	var srv *api.Server
	mcpHandler := mcpserver.HTTPHandler(mcpserver.HTTPOptions{
		Options: mcpserver.Options{Version: version, Logger: logger, Languages: clientLanguages(langs), Images: clientImages(images)},
		Backend: func(r *http.Request) (mcpserver.Backend, error) { return srv.MCPBackend(r) },
	})
	doc, err := api.OpenAPIDocument(version, "/api")
	if err != nil {
		return err
	}
	webHandler := web.Handler(web.Options{OpenAPI: doc, Version: version, APIBase: "/api", Logger: logger, Accounts: true})

	// Async executions and webhook deliveries go through the durable
	// queue in the store's database; its workers call the service that
	// api.New builds, hence the indirection again.
	nodeID := cfg.NodeID
	if nodeID == "" {
		nodeID = defaultNodeID(cfg.DataDir)
	}
	asyncWorkers := cfg.AsyncWorkers
	if asyncWorkers == 0 {
		asyncWorkers = max(1, cfg.MaxConcurrent/2)
	}
	rescue := cfg.QueueRescueAfter.D()
	if rescue == 0 {
		rescue = time.Duration(cfg.MaxTimeoutS())*time.Second + cfg.QueueTimeout.D() + 2*time.Minute
	}
	allow, _ := cfg.WebhookAllow() // validated with the configuration
	guard := webhook.NewGuard(allow, webhook.InterfaceNetworks)
	hooks := &execution.Webhooks{Guard: guard, Client: webhook.NewClient(webhook.Options{Guard: guard}), RetryFor: cfg.WebhookRetryFor.D()}
	q, err := openQueue(ctx, st, queue.Handlers{
		Run: func(ctx context.Context, tenant, id string) error { return srv.Service().RunQueued(ctx, tenant, id) },
		Deliver: func(ctx context.Context, tenant, id string, attempt int, first time.Time) error {
			return srv.Service().DeliverWebhook(ctx, tenant, id, attempt, first)
		},
	}, queue.Options{Workers: asyncWorkers, NodeID: nodeID, RescueAfter: rescue, RetryBase: cfg.WebhookRetryBase.D(), Logger: logger})
	if err != nil {
		return err
	}

	var mailer account.Mailer
	if cfg.SMTPURL != "" {
		m, err := account.ParseSMTPURL(cfg.SMTPURL)
		if err != nil {
			return err
		}
		mailer = m
	}
	accounts, err := account.New(account.Options{Store: st, Signup: cfg.Signup, Mailer: mailer, PublicURL: cfg.PublicURL, Logger: logger})
	if err != nil {
		return err
	}
	pages := web.NewPages(web.Options{OpenAPI: doc, Version: version, APIBase: "/api", Logger: logger})

	srv, err = api.New(api.Options{
		Service: execution.Options{
			Store:         st,
			Engine:        eng,
			Languages:     langs,
			Images:        images,
			Plans:         cfg.Plans,
			MaxCodeBytes:  cfg.MaxCodeBytes,
			MaxStdinBytes: cfg.MaxStdinBytes,
			QueueTimeout:  cfg.QueueTimeout.D(),
			NodeID:        nodeID,
			Queue:         q,
			Webhooks:      hooks,
			NodeTimeout:   cfg.NodeTimeout.D(),
		},
		Accounts:   accounts,
		Pages:      pages,
		PublicURL:  cfg.PublicURL,
		Version:    version,
		EdgeSecret: cfg.EdgeSecret,
		Web:        webHandler,
		MCP:        mcpHandler,
		Metrics:    metrics,
		Logger:     logger,
	})
	if err != nil {
		return err
	}

	// Settle what an earlier run of this node left unfinished, then keep
	// sending heartbeats; the queue's workers start after that.
	bgCtx, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBackground()
	if err := srv.Service().Start(bgCtx); err != nil {
		return err
	}
	if err := q.Start(bgCtx); err != nil {
		return fmt.Errorf("starting the queue: %w", err)
	}
	go accounts.PurgeEvery(bgCtx, account.PurgeInterval)

	ln, err := net.Listen("tcp", cfg.Addr())
	if err != nil {
		return fmt.Errorf("listening on %s: %w", cfg.Addr(), err)
	}
	// Idle keep-alive connections cost a file descriptor each and need no
	// key; cap them in total and per client address.
	ln = api.LimitListener(ln, api.ConnLimits{Max: cfg.MaxConns, PerAddr: cfg.MaxConnsPerIP, Logger: logger, Metrics: metrics})
	// Writes must outlive the longest execution a plan allows plus the wait
	// for a slot; reads are bounded well below that.
	longest := time.Duration(cfg.MaxTimeoutS())*time.Second + cfg.QueueTimeout.D()
	httpSrv := &http.Server{
		Handler:           srv,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       60 * time.Second,
		WriteTimeout:      longest + 90*time.Second,
		IdleTimeout:       cfg.IdleTimeout.D(),
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          log.New(slogWriter{logger}, "", 0),
	}
	servers := []*http.Server{httpSrv}
	errc := make(chan error, 2)
	go func() { errc <- httpSrv.Serve(ln) }()

	if cfg.MetricsAddr != "" {
		mln, err := net.Listen("tcp", cfg.MetricsAddr)
		if err != nil {
			_ = httpSrv.Close()
			return fmt.Errorf("listening for metrics on %s: %w", cfg.MetricsAddr, err)
		}
		msrv := &http.Server{Handler: metrics.Handler(), ReadHeaderTimeout: 10 * time.Second, ErrorLog: httpSrv.ErrorLog}
		servers = append(servers, msrv)
		go func() { errc <- msrv.Serve(mln) }()
		logger.Info("metrics listening", "addr", mln.Addr().String())
	}

	base := "http://" + ln.Addr().String()
	fmt.Fprintf(e.Stdout, "Vertal Run %s listening on %s\n", version, base)
	warm := "warm pool off"
	if cfg.PoolMax > 0 {
		warm = fmt.Sprintf("warm pool %d..%d per language", cfg.PoolMin, cfg.PoolMax)
	}
	fmt.Fprintf(e.Stdout, "  sandboxes: %s, %d at once, %s; store: %s\n", driver.Name(), cfg.MaxConcurrent, warm, storeDesc)
	fmt.Fprintf(e.Stdout, "  playground: %s/   API: %s/api/v1 (also %s/v1)   OpenAPI: %s/v1/openapi.json\n", base, base, base, base)
	if cfg.Dev {
		if err := devKey(ctx, e, st, base, createKeyHint(cfg, devTenant)); err != nil {
			_ = httpSrv.Close()
			return err
		}
	}
	logger.Info("serving", "addr", ln.Addr().String(), "driver", driver.Name(), "store", storeDesc,
		"max_concurrent", cfg.MaxConcurrent, "queue_timeout", cfg.QueueTimeout.D().String(), "edge_secret", cfg.EdgeSecret != "",
		"max_conns", cfg.MaxConns, "max_conns_per_ip", cfg.MaxConnsPerIP, "idle_timeout", cfg.IdleTimeout.D().String())

	select {
	case err := <-errc:
		for _, s := range servers {
			_ = s.Close()
		}
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	// Finish what is running: an execution in progress is paid for and its
	// result is stored, so let it end before closing the store.
	logger.Info("shutting down; waiting for running requests")
	sctx, cancel := context.WithTimeout(context.Background(), longest+30*time.Second)
	defer cancel()
	for _, s := range servers {
		if err := s.Shutdown(sctx); err != nil {
			logger.Warn("shutdown", "error", err)
		}
	}
	// The queue's running jobs finish too; those not started stay queued
	// for the next node.
	if err := q.Stop(sctx); err != nil {
		logger.Warn("stopping the queue", "error", err)
	}
	stopBackground()
	logger.Info("stopped")
	return nil
}

// openQueue opens the durable queue on the store's own database.
func openQueue(ctx context.Context, st store.Store, h queue.Handlers, o queue.Options) (*queue.Queue, error) {
	switch db := st.(type) {
	case interface{ WriterDB() *sql.DB }:
		return queue.OpenSQLite(ctx, db.WriterDB(), h, o)
	case interface{ Pool() *pgxpool.Pool }:
		return queue.OpenPostgres(ctx, db.Pool(), h, o)
	}
	return nil, fmt.Errorf("the store %T has no database for the queue", st)
}

// defaultNodeID names this installation among the nodes of a database:
// the host name and a hash of the data directory, so it stays the same
// across restarts and two servers on one host (each with its own data
// directory) differ.
func defaultNodeID(dataDir string) string {
	host, _ := os.Hostname()
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		abs = dataDir
	}
	sum := sha256.Sum256([]byte(host + "\x00" + abs))
	return host + "-" + hex.EncodeToString(sum[:4])
}

// openStore opens PostgreSQL when the URL says so, else SQLite in the data
// directory. The description never contains the URL: it may hold a
// password.
func openStore(ctx context.Context, cfg config.Config) (store.Store, string, error) {
	if cfg.UsesPostgres() {
		st, err := postgres.Open(ctx, cfg.DatabaseURL)
		if err != nil {
			return nil, "", fmt.Errorf("opening PostgreSQL: %w", err)
		}
		return st, "postgresql", nil
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, "", fmt.Errorf("creating data directory: %w", err)
	}
	path := sqlitePath(cfg)
	st, err := sqlite.Open(ctx, path)
	if err != nil {
		return nil, "", fmt.Errorf("opening SQLite: %w", err)
	}
	return st, "sqlite " + path, nil
}

// sqlitePath is where the SQLite store of cfg lives.
func sqlitePath(cfg config.Config) string { return filepath.Join(cfg.DataDir, "vertal.db") }

// newDriver builds the configured sandbox driver and the pre-starter the
// warm pool uses with it. stateDir "" is the driver's default; operator
// commands (doctor, bench) pass their own, so their Reap never touches a
// running server's sandboxes.
func newDriver(ctx context.Context, cfg config.Config, stateDir string, logger *slog.Logger) (engine.Driver, pool.Prestarter, func(), error) {
	sub := func(name string) string {
		if stateDir == "" {
			return ""
		}
		return filepath.Join(stateDir, name)
	}
	switch cfg.Driver {
	case "docker":
		d, err := docker.New(ctx, docker.Options{Runtime: cfg.Runtime, Image: cfg.DockerImage, StateDir: sub("docker"), Logger: logger})
		if err != nil {
			return nil, nil, nil, fmt.Errorf("docker driver: %w", err)
		}
		return d, docker.NewPrestarter(d), func() { _ = d.Close() }, nil
	default:
		if fi, err := os.Stat(cfg.RootFS()); err != nil || !fi.IsDir() {
			return nil, nil, nil, fmt.Errorf("no sandbox root filesystem at %s: build it with `vertal image build` or point --image-dir at one", cfg.RootFS())
		}
		d, err := oci.New(ctx, oci.Options{Runtime: cfg.Runtime, StateDir: sub("oci"), Logger: logger})
		if err != nil {
			return nil, nil, nil, fmt.Errorf("oci driver: %w", err)
		}
		return d, oci.NewPrestarter(d), func() { _ = d.Close() }, nil
	}
}

// reapUIDLeases releases the leases of the host-wide uid pool that both
// drivers lease from whose holders died (see uidpool.Pool.Reap).
func reapUIDLeases() (int, error) {
	p, err := uidpool.New("", 0, 0)
	if err != nil {
		return 0, err
	}
	return p.Reap()
}

func clientLanguages(ls []engine.Language) []client.Language {
	out := make([]client.Language, 0, len(ls))
	for _, l := range ls {
		out = append(out, client.Language{Name: l.Name, Version: l.Version, Aliases: lang.Aliases(l.Name)})
	}
	return out
}

// devKey gives the development tenant a key on the first start and prints
// it with the lines to use it; later starts say where it went.
func devKey(ctx context.Context, e *env, st store.Store, base, hint string) error {
	keys, err := st.ListKeys(ctx, devTenant)
	if err != nil {
		return fmt.Errorf("dev mode: listing keys: %w", err)
	}
	for _, k := range keys {
		if k.RevokedAt.IsZero() {
			fmt.Fprintf(e.Stdout, "Development tenant %q already has a key (printed on its first start).\n"+
				"  A new one: %s\n", devTenant, hint)
			return nil
		}
	}
	secret, k, err := api.CreateKey(ctx, st, devTenant, "pro", time.Now())
	if err != nil {
		return fmt.Errorf("dev mode: %w", err)
	}
	fmt.Fprintf(e.Stdout, "Development key for tenant %q (plan pro, id %s). It is shown only now:\n\n  %s\n\n", devTenant, k.ID, secret)
	fmt.Fprintf(e.Stdout, "  export KUBO_API_URL=%s/api KUBO_API_KEY=%s\n", base, secret)
	fmt.Fprintf(e.Stdout, "  curl -X POST $KUBO_API_URL/v1/executions -H \"Authorization: Bearer $KUBO_API_KEY\" \\\n"+
		"    -H \"Content-Type: application/json\" -d '{\"language\": \"python\", \"code\": \"print(6 * 7)\"}'\n")
	return nil
}

// createKeyHint is the create-key command line that acts on the server's
// own database: it names a --data-dir that is not the default (made
// absolute, since the operator may run it elsewhere), or the PostgreSQL
// URL with its password masked.
func createKeyHint(cfg config.Config, tenant string) string {
	hint := "vertal create-key " + tenant + " --plan pro"
	switch {
	case cfg.UsesPostgres():
		u := cfg.DatabaseURL
		if pu, err := url.Parse(u); err == nil {
			u = pu.Redacted()
		}
		hint += " --database-url " + shellArg(u)
	case cfg.DataDir != config.DefaultDataDir:
		dir := cfg.DataDir
		if abs, err := filepath.Abs(dir); err == nil {
			dir = abs
		}
		hint += " --data-dir " + shellArg(dir)
	}
	return hint
}

// shellArg quotes s for a POSIX shell when it holds anything but plain
// path characters.
func shellArg(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+:@,=") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// slogWriter sends net/http's own complaints (TLS garbage, hijack errors)
// to the structured log.
type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.l.Warn(strings.TrimSpace(string(p)), "source", "net/http")
	return len(p), nil
}

var _ io.Writer = slogWriter{}

// collectImageVersions deletes replaced image versions once no sandbox
// runs on them (vertal image build does too, but only when it runs).
func collectImageVersions(ctx context.Context, images []config.Image, logger *slog.Logger) {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, img := range images {
			removed, err := image.GC(img.Dir, image.RetireGrace)
			if err != nil {
				logger.Warn("removing unused image versions", "image", img.Name, "error", err)
			}
			for _, v := range removed {
				logger.Info("removed unused image version", "image", img.Name, "version", v)
			}
		}
	}
}

// clientImages is what the MCP tool description lists of each image.
func clientImages(images []config.Image) []client.Image {
	var out []client.Image
	for _, img := range images {
		ci := client.Image{Name: img.Name, Languages: clientLanguages(img.Languages), Packages: []client.Package{}}
		if m, err := image.ReadManifest(img.Dir); err == nil {
			for _, p := range m.Main() {
				ci.Packages = append(ci.Packages, client.Package{Name: p.Name, Version: p.Version, Source: p.Source})
			}
		}
		out = append(out, ci)
	}
	return out
}
