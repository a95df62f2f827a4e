// istio-peer serves Istio's sidecar injection webhook (istio.io/istio, package pkg/kube/inject)
// for the benchmark's peer row: Istio's default injection template, values and mesh config,
// rendered in process from the module's own charts, answering POST /inject over TLS (HTTP/1.1
// and HTTP/2) on a loopback address. Everything here is setup; the webhook is Istio's.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"istio.io/istio/operator/pkg/render"
	"istio.io/istio/pilot/pkg/model"
	"istio.io/istio/pkg/config/mesh"
	"istio.io/istio/pkg/config/mesh/meshwatcher"
	"istio.io/istio/pkg/kube/inject"
	"istio.io/istio/pkg/kube/multicluster"
)

// manifestsDir is where the istio.io/istio module's manifests/ directory is; the build script
// sets it (-ldflags -X) from `go mod download -json`.
var manifestsDir = ""

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "istio-peer: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve on (loopback only)")
	certFile := flag.String("tls-cert-file", "", "serving certificate (PEM)")
	keyFile := flag.String("tls-key-file", "", "serving key (PEM)")
	manifests := flag.String("manifests", manifestsDir, "the istio.io/istio module's manifests/ directory")
	procs := flag.Int("gomaxprocs", 0, "GOMAXPROCS (0: the number of CPUs this process may use)")
	exitAfter := flag.Duration("exit-after", 15*time.Minute, "exit by itself after this long")
	cpuProfile := flag.String("cpu-profile", "", "write a Go CPU profile of the whole run here (go tool pprof)")
	flag.Parse()

	if *certFile == "" || *keyFile == "" {
		return errors.New("--tls-cert-file and --tls-key-file are required")
	}
	if *manifests == "" {
		return errors.New("--manifests is required (the build script normally sets it)")
	}
	host, _, err := net.SplitHostPort(*listen)
	if err != nil {
		return fmt.Errorf("--listen %q: %v", *listen, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("--listen %q: only a loopback IP address is allowed", *listen)
	}
	if *procs > 0 {
		runtime.GOMAXPROCS(*procs)
	}

	config, values, meshYAML, err := defaults(*manifests)
	if err != nil {
		return err
	}

	// The injector reads its template and values through a file watcher, as in istiod.
	dir, err := os.MkdirTemp("", "istio-peer-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	configFile, valuesFile := filepath.Join(dir, "config"), filepath.Join(dir, "values")
	if err := os.WriteFile(configFile, []byte(config), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(valuesFile, []byte(values), 0o600); err != nil {
		return err
	}
	watcher, err := inject.NewFileWatcher(configFile, valuesFile)
	if err != nil {
		return fmt.Errorf("injection config watcher: %v", err)
	}

	meshConfig, err := mesh.ApplyMeshConfig(meshYAML, mesh.DefaultMeshConfig())
	if err != nil {
		return fmt.Errorf("mesh config: %v", err)
	}
	env := model.Environment{
		Watcher:     meshwatcher.NewTestWatcher(meshConfig),
		ConfigStore: model.NewFakeStore(),
	}
	env.SetPushContext(&model.PushContext{})

	mux := http.NewServeMux()
	webhook, err := inject.NewWebhook(inject.WebhookParameters{
		Watcher:      watcher,
		Env:          &env,
		Mux:          mux,
		MultiCluster: multicluster.NewFakeController(),
	})
	if err != nil {
		return fmt.Errorf("injection webhook: %v", err)
	}
	if *cpuProfile != "" {
		out, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer out.Close()
		if err := pprof.StartCPUProfile(out); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	stop := make(chan struct{})
	defer close(stop)
	webhook.Run(stop)

	listener, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	// A nil TLSConfig lets net/http offer h2 and http/1.1 by ALPN.
	server := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	fmt.Fprintf(os.Stderr, "istio-peer: serving POST /inject on https://%s (GOMAXPROCS %d)\n",
		listener.Addr(), runtime.GOMAXPROCS(0))

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- server.ServeTLS(listener, *certFile, *keyFile) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	case <-time.After(*exitAfter):
	}
	shutdown, done := context.WithTimeout(context.Background(), 2*time.Second)
	defer done()
	return server.Shutdown(shutdown)
}

// defaults renders Istio's own chart (the empty profile with the pilot component, i.e. istiod's
// defaults) and returns the injection template config, the injection values and the mesh config.
func defaults(manifests string) (config, values, meshYAML string, err error) {
	sets, _, err := render.GenerateManifest(nil, []string{
		"installPackagePath=" + manifests,
		"profile=empty",
		"components.pilot.enabled=true",
	}, false, nil, nil)
	if err != nil {
		return "", "", "", fmt.Errorf("rendering Istio's manifests from %s: %v", manifests, err)
	}
	for _, set := range sets {
		for _, m := range set.Manifests {
			if m.Unstructured == nil || m.GetKind() != "ConfigMap" {
				continue
			}
			switch m.GetName() {
			case "istio-sidecar-injector":
				config, _, _ = unstructured.NestedString(m.Object, "data", "config")
				values, _, _ = unstructured.NestedString(m.Object, "data", "values")
			case "istio":
				meshYAML, _, _ = unstructured.NestedString(m.Object, "data", "mesh")
			}
		}
	}
	if config == "" || values == "" || meshYAML == "" {
		return "", "", "", errors.New("the rendered manifests lack the istio-sidecar-injector or istio ConfigMap")
	}
	return config, values, meshYAML, nil
}
