package brokerapi

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshagent/meshagent/brokerapi/brokerpb"
	"github.com/meshagent/meshagent/internal/logkeys"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/secret"
	"github.com/meshagent/meshagent/secretmanager"
)

// workloadStream is an open stream for one pod, ended by PodLeft.
type workloadStream struct {
	cancel context.CancelCauseFunc
}

// workloadLeft is the cause of a stream ended because its pod left.
type workloadLeft struct{ why string }

func (w workloadLeft) Error() string { return w.why }

// SubscribeToX509SVID streams the referenced workload's X.509-SVID (chain,
// PKCS#8 key, bundle of its trust domain, revocation lists), again at each
// rotation or trust change, until the broker goes or the workload leaves.
func (s *Server) SubscribeToX509SVID(req *brokerpb.SubscribeToX509SVIDRequest, stream grpc.ServerStreamingServer[brokerpb.SubscribeToX509SVIDResponse]) error {
	return s.serve(stream.Context(), methodX509SVID, req.GetReference(), []string{secretmanager.WorkloadCertName, secretmanager.RootCertName},
		func(secrets []*secretmanager.Secret) error {
			resp, err := svidResponse(secrets[0], secrets[1])
			if err != nil {
				return err
			}
			if err := stream.Send(resp); err != nil {
				return err
			}
			s.metrics.svids.Inc()
			return nil
		})
}

// SubscribeToX509Bundles streams the bundle of the referenced workload's
// trust domain, again when it changes.
func (s *Server) SubscribeToX509Bundles(req *brokerpb.SubscribeToX509BundlesRequest, stream grpc.ServerStreamingServer[brokerpb.SubscribeToX509BundlesResponse]) error {
	var td spiffeid.TrustDomain
	return s.serve(stream.Context(), methodX509Bundles, req.GetReference(), []string{secretmanager.RootCertName},
		func(secrets []*secretmanager.Secret) error {
			resp, err := bundlesResponse(td, secrets[0])
			if err != nil {
				return err
			}
			return stream.Send(resp)
		}, func(w workload) error {
			id, err := spiffeid.FromString(w.pod.Identity.SPIFFEID)
			td = id.TrustDomain()
			return err
		})
}

// unimplemented answers the JWT methods.
func unimplemented(method string) error {
	return status.Errorf(codes.Unimplemented,
		"%s is not served: this agent's CA issues X.509 certificates only and it holds no JWT signing authority (SubscribeToX509SVID and SubscribeToX509Bundles are served)", method)
}

// FetchJWTSVID is not served: there is no JWT authority.
func (s *Server) FetchJWTSVID(ctx context.Context, _ *brokerpb.FetchJWTSVIDRequest) (*brokerpb.FetchJWTSVIDResponse, error) {
	if _, err := s.authorize(ctx, methodJWTSVID); err != nil {
		return nil, err
	}
	s.metrics.refused.WithLabelValues(refusedUnimplemented).Inc()
	return nil, unimplemented(methodJWTSVID)
}

// SubscribeToJWTBundles is not served: there is no JWT authority.
func (s *Server) SubscribeToJWTBundles(_ *brokerpb.SubscribeToJWTBundlesRequest, stream grpc.ServerStreamingServer[brokerpb.SubscribeToJWTBundlesResponse]) error {
	if _, err := s.authorize(stream.Context(), methodJWTBundles); err != nil {
		return err
	}
	s.metrics.refused.WithLabelValues(refusedUnimplemented).Inc()
	return unimplemented(methodJWTBundles)
}

// serve is a stream's life: authorize the broker, resolve the reference,
// take a place within the broker's limits, then follow names of the
// workload's identity with send until the broker goes or the pod leaves.
// prepare, when given, runs once the workload is known.
func (s *Server) serve(ctx context.Context, method string, ref *brokerpb.WorkloadReference, names []string,
	send func([]*secretmanager.Secret) error, prepare ...func(workload) error) error {
	b, err := s.authorize(ctx, method)
	if err != nil {
		return err
	}
	w, refType, r := s.resolve(ctx, b, ref)
	if r != nil {
		return s.refuse(ctx, method, b.ID, refType, r)
	}
	defer w.pin.closeIfSet()
	for _, p := range prepare {
		if err := p(w); err != nil {
			return s.refuse(ctx, method, b.ID, refType, notEntitled(w.via+": "+err.Error()))
		}
	}
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	release, r := s.admit(b.ID, w.pod.UID, &workloadStream{cancel: cancel})
	if r != nil {
		return s.refuse(ctx, method, b.ID, refType, r)
	}
	defer release()
	// The pod may have left between the look-up and the admission, before
	// PodLeft could see this stream.
	if p, ok := s.cfg.Pods.Get(w.pod.UID); !ok || p.Terminated() {
		return s.refuse(ctx, method, b.ID, refType, notFound(w.via+": the pod has left the node"))
	}
	id := s.streamIDs.Add(1)
	s.log.Debug("broker stream opened", zap.Uint64(logkeys.Stream, id), zap.String(logkeys.Method, method), zap.String(logkeys.Broker, b.ID.String()),
		zap.String(logkeys.Reference, w.via), zap.String(logkeys.Pod, w.pod.String()), zap.Stringer(logkeys.Identity, w.pod.Identity))
	if w.pin != nil {
		// The process's exit ends the stream, as its pod's leaving does.
		exited := w.pin.exited()
		go func() {
			select {
			case <-exited:
				cancel(workloadLeft{why: "process has exited"})
			case <-sctx.Done():
			}
		}()
	}
	err = s.follow(sctx, w.pod.Identity, names, send)
	if cause := context.Cause(sctx); ctx.Err() == nil && errors.As(cause, new(workloadLeft)) {
		s.metrics.ended.WithLabelValues("workload_left").Inc()
		return status.Errorf(codes.NotFound, "%s (pod %s): %s", w.via, w.pod.String(), cause.Error())
	}
	if err != nil && status.Code(err) != codes.Canceled {
		s.metrics.ended.WithLabelValues("error").Inc()
		s.log.Warn("broker stream ended with an error", zap.Uint64(logkeys.Stream, id), zap.String(logkeys.Method, method),
			zap.String(logkeys.Broker, b.ID.String()), zap.String(logkeys.Pod, w.pod.String()), zap.Error(err))
	}
	return err
}

// admit takes a place for a stream of broker for pod, or refuses it. The
// function gives the place back.
func (s *Server) admit(broker spiffeid.ID, pod string, ws *workloadStream) (func(), *refusal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	bc := s.brokers[broker]
	if bc == nil {
		bc = &brokerCount{pods: map[string]int{}}
		s.brokers[broker] = bc
	}
	if bc.streams >= s.cfg.MaxStreams {
		return nil, &refusal{reason: refusedMaxStreams, code: codes.ResourceExhausted,
			msg: fmt.Sprintf("broker %s holds %d streams, its limit%s", broker, s.cfg.MaxStreams, settingName(s.cfg.MaxStreamsSetting))}
	}
	if bc.pods[pod] == 0 && len(bc.pods) >= s.cfg.MaxWorkloads {
		return nil, &refusal{reason: refusedMaxWorkloads, code: codes.ResourceExhausted,
			msg: fmt.Sprintf("broker %s holds streams for %d workloads, its limit%s", broker, s.cfg.MaxWorkloads, settingName(s.cfg.MaxWorkloadsSetting))}
	}
	bc.streams++
	bc.pods[pod]++
	set := s.byPod[pod]
	if set == nil {
		set = map[*workloadStream]struct{}{}
		s.byPod[pod] = set
	}
	set[ws] = struct{}{}
	s.metrics.streams.Inc()
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.metrics.streams.Dec()
		delete(set, ws)
		if len(set) == 0 {
			delete(s.byPod, pod)
		}
		bc.streams--
		if bc.pods[pod]--; bc.pods[pod] == 0 {
			delete(bc.pods, pod)
		}
		if bc.streams == 0 {
			delete(s.brokers, broker)
		}
	}, nil
}

func settingName(name string) string {
	if name == "" {
		return ""
	}
	return " (" + name + ")"
}

// PodLeft ends the streams of the pod with uid: it was deleted or has
// finished (why says which). The pod index calls it.
func (s *Server) PodLeft(uid, why string) {
	s.mu.Lock()
	var cancels []context.CancelCauseFunc
	for ws := range s.byPod[uid] {
		cancels = append(cancels, ws.cancel)
	}
	s.mu.Unlock()
	for _, c := range cancels {
		c(workloadLeft{why: why})
	}
}

// follow watches names of ident, reads them and sends them, and again each
// time one changes to a version not sent yet. It returns when ctx ends or a
// send fails. A first read that fails ends the stream; a later one is
// logged, and the broker keeps what it holds until the next change.
func (s *Server) follow(ctx context.Context, ident pki.Identity, names []string, send func([]*secretmanager.Secret) error) error {
	// Watch before reading, so no change slips between the two.
	var w0, w1 <-chan struct{}
	for i, name := range names {
		ch, cancel := s.cfg.Secrets.Watch(ident, name)
		defer cancel()
		if i == 0 {
			w0 = ch
		} else {
			w1 = ch
		}
	}
	var sent []uint64
	for {
		secrets, err := s.readAll(ctx, ident, names)
		switch {
		case err != nil && sent == nil:
			return err
		case err != nil:
			if ctx.Err() != nil {
				return status.FromContextError(ctx.Err()).Err()
			}
			s.log.Warn("broker update not sent", zap.Stringer(logkeys.Identity, ident), zap.Error(err))
		case !secret.SameVersions(secrets, sent):
			if err := send(secrets); err != nil {
				return err
			}
			sent = sent[:0]
			for _, sec := range secrets {
				sent = append(sent, sec.Version)
			}
		}
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-w0:
		case <-w1:
		}
	}
}

func (s *Server) readAll(ctx context.Context, ident pki.Identity, names []string) ([]*secretmanager.Secret, error) {
	out := make([]*secretmanager.Secret, len(names))
	for i, name := range names {
		sec, err := s.cfg.Secrets.Secret(ctx, ident, name)
		switch {
		case err == nil:
			out[i] = sec
		case ctx.Err() != nil:
			return nil, status.FromContextError(ctx.Err()).Err()
		case errors.Is(err, secretmanager.ErrNoIdentity) || errors.Is(err, secretmanager.ErrUnknownResource):
			return nil, status.Errorf(codes.PermissionDenied, "no %s for %s: %v", name, ident, err)
		default:
			return nil, status.Errorf(codes.Unavailable, "%s of %s not available: %v", name, ident, err)
		}
	}
	return out, nil
}

// svidResponse is the X.509-SVID of cert with the bundle and revocation
// lists of roots.
func svidResponse(cert, roots *secretmanager.Secret) (*brokerpb.SubscribeToX509SVIDResponse, error) {
	chain, err := pki.ParseCertificates(cert.CertChain)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "certificate chain of %s: %v", cert.Identity, err)
	}
	key, err := keyDER(cert.PrivateKey)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "private key of %s: %v", cert.Identity, err)
	}
	bundle, err := bundleDER(roots)
	if err != nil {
		return nil, err
	}
	return &brokerpb.SubscribeToX509SVIDResponse{
		Svids: []*brokerpb.X509SVID{{
			SpiffeId:    cert.Identity.SPIFFEID,
			X509Svid:    concatDER(chain),
			X509SvidKey: key,
			Bundle:      bundle,
		}},
		Crl: crlDER(roots.CRL),
	}, nil
}

// bundlesResponse is the bundle of td keyed by its SPIFFE ID, with the
// revocation lists.
func bundlesResponse(td spiffeid.TrustDomain, roots *secretmanager.Secret) (*brokerpb.SubscribeToX509BundlesResponse, error) {
	bundle, err := bundleDER(roots)
	if err != nil {
		return nil, err
	}
	return &brokerpb.SubscribeToX509BundlesResponse{Bundles: map[string][]byte{td.IDString(): bundle}, Crl: crlDER(roots.CRL)}, nil
}

func bundleDER(roots *secretmanager.Secret) ([]byte, error) {
	certs := roots.Bundle.Certs()
	if len(certs) == 0 {
		return nil, status.Error(codes.Internal, "trust bundle: no parsed roots")
	}
	return concatDER(certs), nil
}

func concatDER(certs []*x509.Certificate) []byte {
	var out []byte
	for _, c := range certs {
		out = append(out, c.Raw...)
	}
	return out
}

// keyDER is the DER of a PKCS#8 PEM key.
func keyDER(pemKey []byte) ([]byte, error) {
	block, _ := pem.Decode(pemKey)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, errors.New("not a PKCS#8 PEM key")
	}
	return block.Bytes, nil
}

// crlDER is each X509 CRL block of PEM as DER; nil for none.
func crlDER(pemCRL []byte) [][]byte {
	var out [][]byte
	for rest := pemCRL; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return out
		}
		if block.Type == "X509 CRL" {
			out = append(out, block.Bytes)
		}
	}
}
