// Command envoy stands in for Envoy where Envoy cannot be had: pilot-agent starts it as
// it starts Envoy (`envoy -c <bootstrap> --drain-time-s ... --disable-hot-restart ...`,
// pkg/envoy in istio.io/istio) and it does, from the bootstrap pilot-agent rendered, the
// parts of Envoy's job the tests look at:
//
//   - SDS: every ENVOY_STANDIN_INTERVAL (default 5s) it fetches `default` and `ROOTCA` from
//     the cluster ENVOY_STANDIN_SDS_CLUSTER (default `sds-grpc`, the cluster Istio's
//     bootstrap points secrets at: a pipe, relative to the working directory as in Envoy)
//     on two StreamSecrets streams of one connection, as Envoy subscribes per secret, and
//     prints one JSON line of kind "sds": the leaf's SPIFFE ID, serial and NotAfter, how
//     many roots ROOTCA held, or the error; with ENVOY_STANDIN_SDS_STREAM=true it instead
//     holds one StreamSecrets stream for `default`, as Envoy does, prints a line of kind
//     "sds" (stream true) for every answer and one with the error when the stream breaks,
//     and opens a new one after Envoy's back-off (jittered exponential, 500 ms base, 30 s at
//     most, reset by an answer);
//   - ADS: it subscribes to Clusters and Listeners on the bootstrap's ADS cluster
//     (`xds-grpc`, pilot-agent's xDS proxy) with the bootstrap's node, acknowledges each
//     response, counts it as an update_success and prints a line of kind "xds";
//   - admin (the bootstrap's admin address, 127.0.0.1:15000 in Istio's): /ready ("LIVE"),
//     /stats (the `name: value` lines pilot-agent's readiness parses: server.state 0,
//     listener_manager.workers_started 1, and the CDS and LDS update counters, which stay
//     0 until the control plane's configuration really arrived, as in Envoy, so pilot-agent
//     reports ready only then), /stats/prometheus, /server_info, /drain_listeners and
//     /quitquitquit (exits);
//   - the bootstrap's static listeners whose plain HTTP routes send a path prefix to a
//     static cluster (Istio's 15090 Prometheus and 15021 health listeners): served by
//     forwarding to that cluster's address.
//
// It exits 0 on SIGTERM or SIGINT, as Envoy does. Everything else of the bootstrap is
// ignored: it is read as loose JSON (the node through protojson), because Istio's
// bootstrap carries typed extension configs no Go registry here knows.
package main

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
)

// Line is one line of output.
type Line struct {
	Time time.Time `json:"time"`
	Kind string    `json:"kind"` // "start", "sds", "xds", "admin", "exit"
	// sds
	SpiffeID string    `json:"spiffe_id,omitempty"`
	Serial   string    `json:"serial,omitempty"` // hexadecimal, as meshagent logs it
	NotAfter time.Time `json:"not_after,omitzero"`
	Roots    int       `json:"roots,omitempty"`
	Stream   bool      `json:"stream,omitempty"`
	// xds
	Type      string `json:"type,omitempty"`
	Version   string `json:"version,omitempty"`
	Resources int    `json:"resources,omitempty"`
	// start
	Bootstrap string   `json:"bootstrap,omitempty"`
	Args      []string `json:"args,omitempty"`
	Socket    string   `json:"socket,omitempty"`
	Admin     string   `json:"admin,omitempty"`
	UID       int      `json:"uid,omitempty"`
	Message   string   `json:"message,omitempty"`
	Error     string   `json:"error,omitempty"`
}

var outMu sync.Mutex

func emit(l Line) {
	l.Time = time.Now().UTC()
	b, _ := json.Marshal(l)
	outMu.Lock()
	defer outMu.Unlock()
	fmt.Fprintf(os.Stdout, "%s\n", b)
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		emit(Line{Kind: "exit", Error: err.Error()})
		os.Exit(1)
	}
	emit(Line{Kind: "exit"})
}

// configPath finds Envoy's -c / --config-path among args; every other flag is Envoy's and
// ignored.
func configPath(args []string) (string, error) {
	for i, a := range args {
		for _, f := range []string{"-c", "--config-path"} {
			if a == f && i+1 < len(args) {
				return args[i+1], nil
			}
			if v, ok := strings.CutPrefix(a, f+"="); ok {
				return v, nil
			}
		}
	}
	return "", errors.New("no -c <bootstrap> argument")
}

func run(args []string) error {
	path, err := configPath(args)
	if err != nil {
		return err
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading the bootstrap: %w", err)
	}
	bs, err := parseBootstrap(raw)
	if err != nil {
		return fmt.Errorf("bootstrap %s: %w", path, err)
	}
	sdsCluster := envOr("ENVOY_STANDIN_SDS_CLUSTER", "sds-grpc")
	interval, err := time.ParseDuration(envOr("ENVOY_STANDIN_INTERVAL", "5s"))
	if err != nil || interval <= 0 {
		return fmt.Errorf("ENVOY_STANDIN_INTERVAL: want a positive duration")
	}
	sdsAddr, err := bs.clusterAddress(sdsCluster)
	if err != nil {
		return err
	}
	adminAddr := bs.Admin.Address.hostPort()
	if adminAddr == "" {
		return errors.New("the bootstrap names no admin socket address")
	}
	emit(Line{Kind: "start", Bootstrap: path, Args: args, Socket: sdsAddr.String(), Admin: adminAddr, UID: os.Getuid()})

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	st := &stats{}
	adminLis, err := net.Listen("tcp", adminAddr)
	if err != nil {
		return fmt.Errorf("admin: %w", err)
	}
	servers := []*http.Server{{Handler: adminMux(st, cancel)}}
	listeners := []net.Listener{adminLis}
	for _, l := range bs.StaticResources.Listeners {
		h, err := bs.listenerHandler(l)
		if err != nil {
			emit(Line{Kind: "admin", Message: "listener " + l.Name + " not served", Error: err.Error()})
			continue
		}
		lis, err := net.Listen("tcp", l.Address.hostPort())
		if err != nil {
			emit(Line{Kind: "admin", Message: "listener " + l.Name + " not served", Error: err.Error()})
			continue
		}
		servers = append(servers, &http.Server{Handler: h})
		listeners = append(listeners, lis)
	}
	for i, s := range servers {
		go func() { _ = s.Serve(listeners[i]) }()
	}
	st.live.Store(true)

	var wg sync.WaitGroup
	if os.Getenv("ENVOY_STANDIN_SDS_STREAM") == "true" {
		wg.Go(func() { sdsStreamLoop(ctx, sdsAddr, bs.node, st) })
	} else {
		wg.Go(func() { sdsLoop(ctx, sdsAddr, bs.node, interval, st) })
	}
	if name := bs.adsCluster(); name != "" {
		if addr, err := bs.clusterAddress(name); err != nil {
			emit(Line{Kind: "xds", Error: err.Error()})
		} else {
			wg.Go(func() { adsLoop(ctx, addr, bs.node, st) })
		}
	}
	<-ctx.Done()
	for _, s := range servers {
		_ = s.Close()
	}
	wg.Wait()
	return nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// address is an Envoy core.v3.Address: a pipe or a socket address.
type address struct {
	Pipe *struct {
		Path string `json:"path"`
	} `json:"pipe"`
	SocketAddress *struct {
		Address   string `json:"address"`
		PortValue int    `json:"port_value"`
	} `json:"socket_address"`
}

func (a address) hostPort() string {
	if a.SocketAddress == nil {
		return ""
	}
	return net.JoinHostPort(a.SocketAddress.Address, strconv.Itoa(a.SocketAddress.PortValue))
}

// dialTarget is where a cluster's first endpoint is, as a network and an address.
type dialTarget struct{ network, addr string }

func (d dialTarget) String() string { return d.network + ":" + d.addr }

type cluster struct {
	Name           string `json:"name"`
	LoadAssignment struct {
		Endpoints []struct {
			LbEndpoints []struct {
				Endpoint struct {
					Address address `json:"address"`
				} `json:"endpoint"`
			} `json:"lb_endpoints"`
		} `json:"endpoints"`
	} `json:"load_assignment"`
}

type listener struct {
	Name         string  `json:"name"`
	Address      address `json:"address"`
	FilterChains []struct {
		TransportSocket json.RawMessage `json:"transport_socket"`
		Filters         []struct {
			TypedConfig struct {
				RouteConfig struct {
					VirtualHosts []struct {
						Routes []struct {
							Match struct {
								Prefix string `json:"prefix"`
								Path   string `json:"path"`
							} `json:"match"`
							Route *struct {
								Cluster       string `json:"cluster"`
								PrefixRewrite string `json:"prefix_rewrite"`
							} `json:"route"`
						} `json:"routes"`
					} `json:"virtual_hosts"`
				} `json:"route_config"`
			} `json:"typed_config"`
		} `json:"filters"`
	} `json:"filter_chains"`
}

// bootstrap is the part of an Envoy v3 Bootstrap the stand-in reads.
type bootstrap struct {
	Node  json.RawMessage `json:"node"`
	Admin struct {
		Address address `json:"address"`
	} `json:"admin"`
	StaticResources struct {
		Clusters  []cluster  `json:"clusters"`
		Listeners []listener `json:"listeners"`
	} `json:"static_resources"`
	DynamicResources struct {
		AdsConfig struct {
			GrpcServices []struct {
				EnvoyGrpc struct {
					ClusterName string `json:"cluster_name"`
				} `json:"envoy_grpc"`
			} `json:"grpc_services"`
		} `json:"ads_config"`
	} `json:"dynamic_resources"`

	node *corev3.Node
}

func parseBootstrap(raw []byte) (*bootstrap, error) {
	var bs bootstrap
	if err := json.Unmarshal(raw, &bs); err != nil {
		return nil, err
	}
	bs.node = &corev3.Node{}
	if len(bs.Node) > 0 {
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(bs.Node, bs.node); err != nil {
			return nil, fmt.Errorf("node: %w", err)
		}
	}
	return &bs, nil
}

func (bs *bootstrap) clusterAddress(name string) (dialTarget, error) {
	for _, c := range bs.StaticResources.Clusters {
		if c.Name != name {
			continue
		}
		for _, e := range c.LoadAssignment.Endpoints {
			for _, lb := range e.LbEndpoints {
				a := lb.Endpoint.Address
				if a.Pipe != nil {
					// Envoy opens a relative pipe path relative to its working directory.
					return dialTarget{"unix", a.Pipe.Path}, nil
				}
				if hp := a.hostPort(); hp != "" {
					return dialTarget{"tcp", hp}, nil
				}
			}
		}
		return dialTarget{}, fmt.Errorf("static cluster %s has no endpoint address", name)
	}
	return dialTarget{}, fmt.Errorf("the bootstrap has no static cluster %s", name)
}

func (bs *bootstrap) adsCluster() string {
	for _, g := range bs.DynamicResources.AdsConfig.GrpcServices {
		if g.EnvoyGrpc.ClusterName != "" {
			return g.EnvoyGrpc.ClusterName
		}
	}
	return ""
}

// listenerHandler serves a static plain-HTTP listener whose routes send path prefixes to
// static clusters with socket addresses.
func (bs *bootstrap) listenerHandler(l listener) (http.Handler, error) {
	if l.Address.hostPort() == "" {
		return nil, errors.New("no socket address")
	}
	mux := http.NewServeMux()
	n := 0
	for _, fc := range l.FilterChains {
		if len(fc.TransportSocket) > 0 && string(fc.TransportSocket) != "null" {
			return nil, errors.New("TLS listeners are not served")
		}
		for _, f := range fc.Filters {
			for _, vh := range f.TypedConfig.RouteConfig.VirtualHosts {
				for _, r := range vh.Routes {
					if r.Route == nil {
						continue
					}
					target, err := bs.clusterAddress(r.Route.Cluster)
					if err != nil || target.network != "tcp" {
						return nil, fmt.Errorf("route to %s: %v", r.Route.Cluster, err)
					}
					pattern, prefix := r.Match.Path, ""
					if pattern == "" {
						pattern, prefix = r.Match.Prefix, r.Match.Prefix
					}
					if pattern == "" {
						continue
					}
					rewrite := r.Route.PrefixRewrite
					proxy := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
						pr.SetURL(&url.URL{Scheme: "http", Host: target.addr})
						if rewrite != "" && prefix != "" {
							pr.Out.URL.Path = rewrite + strings.TrimPrefix(pr.In.URL.Path, prefix)
						}
					}}
					if prefix != "" && !strings.HasSuffix(pattern, "/") {
						mux.Handle(pattern+"/", proxy)
					}
					mux.Handle(pattern, proxy)
					n++
				}
			}
		}
	}
	if n == 0 {
		return nil, errors.New("no routes to static clusters")
	}
	return mux, nil
}

// stats are the counters the admin endpoints report.
type stats struct {
	live                   atomic.Bool
	cdsSuccess, ldsSuccess atomic.Uint64
	sdsSuccess, sdsFailure atomic.Uint64
}

func (s *stats) all() map[string]uint64 {
	state := uint64(2) // PRE_INITIALIZING
	workers := uint64(0)
	if s.live.Load() {
		state, workers = 0, 1
	}
	return map[string]uint64{
		"server.state":                         state,
		"listener_manager.workers_started":     workers,
		"cluster_manager.cds.update_success":   s.cdsSuccess.Load(),
		"cluster_manager.cds.update_rejected":  0,
		"listener_manager.lds.update_success":  s.ldsSuccess.Load(),
		"listener_manager.lds.update_rejected": 0,
		"standin.sds.fetch_success":            s.sdsSuccess.Load(),
		"standin.sds.fetch_failure":            s.sdsFailure.Load(),
	}
}

func adminMux(st *stats, quit context.CancelFunc) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/ready", func(w http.ResponseWriter, _ *http.Request) {
		if !st.live.Load() {
			http.Error(w, "PRE_INITIALIZING", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "LIVE")
	})
	mux.HandleFunc("/server_info", func(w http.ResponseWriter, _ *http.Request) {
		state := "PRE_INITIALIZING"
		if st.live.Load() {
			state = "LIVE"
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"state": state, "version": "envoy-standin"})
	})
	// /stats?usedonly&filter=<regex>: "name: value" lines, as Envoy prints them.
	mux.HandleFunc("/stats", func(w http.ResponseWriter, r *http.Request) {
		var re *regexp.Regexp
		if f := r.URL.Query().Get("filter"); f != "" {
			var err error
			if re, err = regexp.Compile(f); err != nil {
				http.Error(w, "Invalid regex: "+err.Error(), http.StatusBadRequest)
				return
			}
		}
		all := st.all()
		names := make([]string, 0, len(all))
		for n := range all {
			if re == nil || re.MatchString(n) {
				names = append(names, n)
			}
		}
		sort.Strings(names)
		for _, n := range names {
			fmt.Fprintf(w, "%s: %d\n", n, all[n])
		}
	})
	mux.HandleFunc("/stats/prometheus", func(w http.ResponseWriter, _ *http.Request) {
		all := st.all()
		names := make([]string, 0, len(all))
		for n := range all {
			names = append(names, n)
		}
		sort.Strings(names)
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		for _, n := range names {
			p := "envoy_" + strings.ReplaceAll(n, ".", "_")
			fmt.Fprintf(w, "# TYPE %s gauge\n%s %d\n", p, p, all[n])
		}
	})
	mux.HandleFunc("/drain_listeners", func(w http.ResponseWriter, r *http.Request) {
		emit(Line{Kind: "admin", Message: "drain_listeners " + r.URL.RawQuery})
		fmt.Fprintln(w, "OK")
	})
	mux.HandleFunc("/quitquitquit", func(w http.ResponseWriter, _ *http.Request) {
		emit(Line{Kind: "admin", Message: "quitquitquit"})
		fmt.Fprintln(w, "OK")
		quit()
	})
	return mux
}

func dial(t dialTarget) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///"+t.addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, t.network, addr)
		}))
}

// sdsLoop fetches default and ROOTCA every interval.
func sdsLoop(ctx context.Context, target dialTarget, node *corev3.Node, interval time.Duration, st *stats) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		l := fetchSecrets(ctx, target, node)
		if l.Error == "" {
			st.sdsSuccess.Add(1)
		} else {
			st.sdsFailure.Add(1)
		}
		emit(l)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sdsStreamLoop holds a StreamSecrets stream for default, opening a new one after
// Envoy's back-off when it breaks.
func sdsStreamLoop(ctx context.Context, target dialTarget, node *corev3.Node, st *stats) {
	const base, most = 500 * time.Millisecond, 30 * time.Second
	attempt := 0
	for {
		answered := holdSecret(ctx, target, node, st)
		if ctx.Err() != nil {
			return
		}
		if answered {
			attempt = 0
		}
		limit := base << min(attempt, 6)
		if limit > most {
			limit = most
		}
		attempt++
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(rand.Int64N(int64(limit)))):
		}
	}
}

// holdSecret subscribes to default on one stream, acknowledges and prints every answer,
// and returns when the stream breaks, saying whether it was answered at least once.
func holdSecret(ctx context.Context, target dialTarget, node *corev3.Node, st *stats) bool {
	fail := func(err error) {
		st.sdsFailure.Add(1)
		emit(Line{Kind: "sds", Stream: true, Socket: target.String(), Error: err.Error()})
	}
	conn, err := dial(target)
	if err != nil {
		fail(err)
		return false
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := secretv3.NewSecretDiscoveryServiceClient(conn).StreamSecrets(ctx)
	if err != nil {
		fail(err)
		return false
	}
	req := &discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.SecretType, ResourceNames: []string{"default"}}
	answered := false
	for {
		if err := stream.Send(req); err != nil {
			fail(err)
			return answered
		}
		resp, err := stream.Recv()
		if err != nil {
			if ctx.Err() == nil {
				fail(err)
			}
			return answered
		}
		answered = true
		l := Line{Kind: "sds", Stream: true, Socket: target.String()}
		for _, a := range resp.GetResources() {
			var s tlsv3.Secret
			if a.UnmarshalTo(&s) != nil || s.GetName() != "default" {
				continue
			}
			if leaf, err := firstCert(s.GetTlsCertificate().GetCertificateChain().GetInlineBytes()); err != nil {
				l.Error = err.Error()
			} else {
				if len(leaf.URIs) > 0 {
					l.SpiffeID = leaf.URIs[0].String()
				}
				l.Serial = leaf.SerialNumber.Text(16)
				l.NotAfter = leaf.NotAfter.UTC()
			}
		}
		if l.Error == "" && l.Serial == "" {
			l.Error = fmt.Sprintf("the answer (%d resources) does not hold default", len(resp.GetResources()))
		}
		if l.Error == "" {
			st.sdsSuccess.Add(1)
		} else {
			st.sdsFailure.Add(1)
		}
		emit(l)
		// The acknowledgement, as Envoy sends it.
		req = &discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.SecretType, ResourceNames: []string{"default"},
			VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}
	}
}

// fetchSecrets opens one connection with a stream per secret, as Envoy subscribes, and
// waits for the first answer on each.
func fetchSecrets(ctx context.Context, target dialTarget, node *corev3.Node) Line {
	l := Line{Kind: "sds", Socket: target.String()}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := dial(target)
	if err != nil {
		l.Error = err.Error()
		return l
	}
	defer conn.Close()
	client := secretv3.NewSecretDiscoveryServiceClient(conn)
	secrets := map[string]*tlsv3.Secret{}
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for _, name := range []string{"default", "ROOTCA"} {
		wg.Go(func() {
			s, err := fetchSecret(ctx, client, node, name)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
				return
			}
			secrets[name] = s
		})
	}
	wg.Wait()
	if chain := secrets["default"].GetTlsCertificate().GetCertificateChain().GetInlineBytes(); len(chain) > 0 {
		if leaf, err := firstCert(chain); err != nil {
			errs = append(errs, fmt.Errorf("default: %w", err))
		} else {
			if len(leaf.URIs) > 0 {
				l.SpiffeID = leaf.URIs[0].String()
			}
			l.Serial = leaf.SerialNumber.Text(16)
			l.NotAfter = leaf.NotAfter.UTC()
		}
	} else if secrets["default"] != nil {
		errs = append(errs, errors.New("default: no inline certificate chain"))
	}
	if roots := secrets["ROOTCA"].GetValidationContext().GetTrustedCa().GetInlineBytes(); len(roots) > 0 {
		for rest := roots; ; {
			var b *pem.Block
			if b, rest = pem.Decode(rest); b == nil {
				break
			}
			l.Roots++
		}
	} else if secrets["ROOTCA"] != nil {
		errs = append(errs, errors.New("ROOTCA: no inline trusted CA"))
	}
	if err := errors.Join(errs...); err != nil {
		l.Error = err.Error()
	}
	return l
}

func fetchSecret(ctx context.Context, client secretv3.SecretDiscoveryServiceClient, node *corev3.Node, name string) (*tlsv3.Secret, error) {
	stream, err := client.StreamSecrets(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = stream.CloseSend() }()
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.SecretType, ResourceNames: []string{name}}); err != nil {
		return nil, err
	}
	resp, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	for _, a := range resp.GetResources() {
		var s tlsv3.Secret
		if err := a.UnmarshalTo(&s); err != nil {
			return nil, err
		}
		if s.GetName() == name {
			return &s, nil
		}
	}
	return nil, fmt.Errorf("the answer (%d resources) does not hold it", len(resp.GetResources()))
}

func firstCert(chain []byte) (*x509.Certificate, error) {
	b, _ := pem.Decode(chain)
	if b == nil || b.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(b.Bytes)
}

// adsLoop keeps an ADS stream subscribed to Clusters and Listeners, reconnecting after a
// second when it fails.
func adsLoop(ctx context.Context, target dialTarget, node *corev3.Node, st *stats) {
	for {
		err := ads(ctx, target, node, st)
		if ctx.Err() != nil {
			return
		}
		emit(Line{Kind: "xds", Socket: target.String(), Error: fmt.Sprint(err)})
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

func ads(ctx context.Context, target dialTarget, node *corev3.Node, st *stats) error {
	conn, err := dial(target)
	if err != nil {
		return err
	}
	defer conn.Close()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return err
	}
	// Envoy asks for Clusters first, Listeners once the Clusters are warm; asking for
	// both at once is close enough for a control plane that answers each on its own.
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.ClusterType}); err != nil {
		return err
	}
	if err := stream.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ListenerType}); err != nil {
		return err
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return err
		}
		switch resp.GetTypeUrl() {
		case resourcev3.ClusterType:
			st.cdsSuccess.Add(1)
		case resourcev3.ListenerType:
			st.ldsSuccess.Add(1)
		}
		emit(Line{Kind: "xds", Type: resp.GetTypeUrl(), Version: resp.GetVersionInfo(), Resources: len(resp.GetResources())})
		if err := stream.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}); err != nil {
			return err
		}
	}
}
