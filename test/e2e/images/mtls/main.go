// Command mtls is the end-to-end tests' pod-certificate workload: it reads its key and
// certificate from a podCertificate projected volume and the roots from a
// clusterTrustBundle one, serves mutual TLS on LISTEN, and, when PEER is set, dials
// PEER every INTERVAL for a mutual TLS handshake. Each side verifies the other's chain
// to the roots and takes its identity from the one URI SAN. Every INTERVAL it prints
// one JSON line: its own identity, the files it read (modes and owners), what the last
// handshake showed, and the peers its server accepted. The tests read these lines
// from the pod's log. The files are read again for every handshake, so a certificate
// the kubelet refreshes is used at once.
package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"
)

// File is one file of the volume as the workload sees it.
type File struct {
	Name string `json:"name"`
	Mode string `json:"mode"`
	UID  uint32 `json:"uid"`
	GID  uint32 `json:"gid"`
}

// Report is one line of the workload's output.
type Report struct {
	Time      time.Time `json:"time"`
	Self      string    `json:"self,omitempty"`
	SelfErr   string    `json:"self_err,omitempty"`
	NotBefore time.Time `json:"not_before,omitempty"`
	NotAfter  time.Time `json:"not_after,omitempty"`
	Serial    string    `json:"serial,omitempty"`
	Files     []File    `json:"files,omitempty"`
	// Peer is the server's identity of the last handshake with PEER; PeerSaw is the
	// identity that server reported seeing for this workload.
	Peer    string `json:"peer,omitempty"`
	PeerSaw string `json:"peer_saw,omitempty"`
	PeerErr string `json:"peer_err,omitempty"`
	// Accepted are the client identities the server accepted since the last report.
	Accepted []string `json:"accepted,omitempty"`
	Sockets  []string `json:"sockets,omitempty"`
}

type creds struct {
	cert  tls.Certificate
	leaf  *x509.Certificate
	roots *x509.CertPool
}

var dir string

func load() (*creds, error) {
	bundle, err := os.ReadFile(filepath.Join(dir, "credentialbundle.pem"))
	if err != nil {
		return nil, err
	}
	// The bundle is the key, then the chain: split it into the two PEM parts tls takes.
	var keyPEM, chainPEM []byte
	for rest := bundle; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type == "CERTIFICATE" {
			chainPEM = append(chainPEM, pem.EncodeToMemory(b)...)
		} else {
			keyPEM = append(keyPEM, pem.EncodeToMemory(b)...)
		}
	}
	cert, err := tls.X509KeyPair(chainPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("credentialbundle.pem: %w", err)
	}
	rootsPEM, err := os.ReadFile(filepath.Join(dir, "roots.pem"))
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(rootsPEM) {
		return nil, errors.New("roots.pem: no certificate")
	}
	return &creds{cert: cert, leaf: cert.Leaf, roots: roots}, nil
}

// identity verifies a peer's chain to the roots for usage and returns its one URI SAN.
func identity(raw [][]byte, roots *x509.CertPool, usage x509.ExtKeyUsage) (string, error) {
	if len(raw) == 0 {
		return "", errors.New("no certificate")
	}
	certs := make([]*x509.Certificate, len(raw))
	for i, r := range raw {
		c, err := x509.ParseCertificate(r)
		if err != nil {
			return "", err
		}
		certs[i] = c
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return "", err
	}
	if len(certs[0].URIs) != 1 {
		return "", fmt.Errorf("%d URI SANs, want 1", len(certs[0].URIs))
	}
	return certs[0].URIs[0].String(), nil
}

type server struct {
	mu       sync.Mutex
	accepted []string
}

func (s *server) serve(addr string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "listen:", err)
		os.Exit(1)
	}
	for {
		conn, err := ln.Accept()
		if err != nil {
			continue
		}
		go s.handle(conn)
	}
}

func (s *server) handle(conn net.Conn) {
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	c, err := load()
	if err != nil {
		return
	}
	var peer string
	tc := tls.Server(conn, &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{c.cert},
		ClientAuth:   tls.RequireAnyClientCert,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			var err error
			peer, err = identity(raw, c.roots, x509.ExtKeyUsageClientAuth)
			return err
		},
	})
	if err := tc.Handshake(); err != nil {
		return
	}
	s.mu.Lock()
	s.accepted = append(s.accepted, peer)
	s.mu.Unlock()
	fmt.Fprintln(tc, peer)
}

func (s *server) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.accepted
	s.accepted = nil
	sort.Strings(out)
	return out
}

// dial makes one mutual TLS handshake with peer and returns the server's identity and
// the identity the server says it saw.
func dial(peer string, c *creds) (string, string, error) {
	var id string
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 3 * time.Second}, "tcp", peer, &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{c.cert},
		// The server is named by its URI SAN, not by a host name: the chain and the
		// identity are checked here instead.
		InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			var err error
			id, err = identity(raw, c.roots, x509.ExtKeyUsageServerAuth)
			return err
		},
	})
	if err != nil {
		return "", "", err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(3 * time.Second))
	saw, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return id, "", fmt.Errorf("reading the server's answer: %w", err)
	}
	return id, saw[:len(saw)-1], nil
}

func files() []File {
	var out []File
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		// The projected volume's own ..data links and timestamped directories.
		if e.Name()[0] == '.' {
			continue
		}
		fi, err := os.Stat(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		f := File{Name: e.Name(), Mode: fi.Mode().Perm().String()}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			f.UID, f.GID = st.Uid, st.Gid
		}
		out = append(out, f)
	}
	return out
}

func main() {
	dir = os.Getenv("DIR")
	if dir == "" {
		dir = "/var/run/mesh"
	}
	listen := os.Getenv("LISTEN")
	if listen == "" {
		listen = ":8443"
	}
	peer := os.Getenv("PEER")
	interval, err := time.ParseDuration(os.Getenv("INTERVAL"))
	if err != nil {
		interval = 2 * time.Second
	}
	s := &server{}
	go s.serve(listen)
	enc := json.NewEncoder(os.Stdout)
	for {
		r := Report{Time: time.Now().UTC(), Files: files()}
		for _, p := range []string{"/run/meshagent/socket", "/var/run/secrets/workload-spiffe-uds/socket"} {
			if _, err := os.Lstat(p); err == nil {
				r.Sockets = append(r.Sockets, p)
			}
		}
		if c, err := load(); err != nil {
			r.SelfErr = err.Error()
		} else {
			if len(c.leaf.URIs) == 1 {
				r.Self = c.leaf.URIs[0].String()
			}
			r.NotBefore, r.NotAfter, r.Serial = c.leaf.NotBefore, c.leaf.NotAfter, c.leaf.SerialNumber.Text(16)
			if peer != "" {
				r.Peer, r.PeerSaw, err = dial(peer, c)
				if err != nil {
					r.PeerErr = err.Error()
				}
			}
		}
		r.Accepted = s.take()
		enc.Encode(r)
		time.Sleep(interval)
	}
}
