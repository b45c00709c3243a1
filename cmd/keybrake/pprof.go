package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
)

// startPprof serves Go's profiler on Config.PprofListen when it is set: on a
// listener of its own, never the proxy or admin one, so that profiling under load
// (the benchmark's --cpuprofile) needs no change to the API surfaces. Close stops
// it with the other servers.
func (m *Main) startPprof(ctx context.Context) error {
	if m.Config.PprofListen == "" {
		return nil
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", m.Config.PprofListen)
	if err != nil {
		return fmt.Errorf("pprof listen %s: %w", m.Config.PprofListen, err)
	}
	m.pprofLn = ln
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index) // heap, goroutine, mutex, block, allocs…
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	m.pprofSrv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: m.Config.ReadHeaderTimeout,
		// A CPU profile or trace answers after its ?seconds=N.
		WriteTimeout: m.Config.AdminWriteTimeout,
		IdleTimeout:  m.Config.IdleTimeout,
		ErrorLog:     slog.NewLogLogger(m.logger.With("component", "pprof").Handler(), slog.LevelWarn),
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		_ = m.pprofSrv.Serve(ln) // ErrServerClosed once Close closes it
	}()
	return nil
}

// PprofURL is the profiler listener's URL ("" when it is off or before Run).
func (m *Main) PprofURL() string {
	if m.pprofLn == nil {
		return ""
	}
	return dialableURL(m.pprofLn.Addr(), false)
}
