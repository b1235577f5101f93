package main

import (
	"context"
	"fmt"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// adsMethod is the state-of-the-world ADS stream.
const adsMethod = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"

// maxADSMessage bounds one ADS response read by the benchmark client.
const maxADSMessage = 512 << 20

// sizedMessage is a received message counted but not decoded.
type sizedMessage struct{ size int }

// sizingCodec sends protobuf messages and receives into *sizedMessage
// without decoding, so the client's own cost of a 100 MB response is only
// the transport's, the same whether it comes through the proxy or not.
type sizingCodec struct{}

func (sizingCodec) Name() string { return "proto" }

func (sizingCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("cannot marshal %T", v)
	}
	b, err := proto.Marshal(m)
	if err != nil {
		return nil, err
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}

func (sizingCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*sizedMessage)
	if !ok {
		return fmt.Errorf("cannot unmarshal into %T", v)
	}
	m.size = data.Len()
	return nil
}

// waitReady connects conn and waits until it is ready.
func waitReady(ctx context.Context, conn *grpc.ClientConn) error {
	conn.Connect()
	for {
		s := conn.GetState()
		if s == connectivity.Ready {
			return nil
		}
		if !conn.WaitForStateChange(ctx, s) {
			return fmt.Errorf("connection not ready (%s): %w", s, ctx.Err())
		}
	}
}

// fetchADS opens an ADS stream on conn, sends req and reads the first
// response. It returns the response's size in bytes and the time from opening
// the stream to having the whole response.
func fetchADS(ctx context.Context, conn *grpc.ClientConn, req *discovery.DiscoveryRequest) (int, time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	stream, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, adsMethod,
		grpc.ForceCodecV2(sizingCodec{}), grpc.MaxCallRecvMsgSize(maxADSMessage))
	if err != nil {
		return 0, 0, fmt.Errorf("opening ADS stream: %w", err)
	}
	if err := stream.SendMsg(req); err != nil {
		return 0, 0, fmt.Errorf("sending ADS request: %w", err)
	}
	var m sizedMessage
	if err := stream.RecvMsg(&m); err != nil {
		return 0, 0, fmt.Errorf("receiving ADS response: %w", err)
	}
	return m.size, time.Since(start), nil
}
