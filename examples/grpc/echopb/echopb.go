// Package echopb is the Echo gRPC service of the example, written out by
// hand in the shape protoc-gen-go-grpc generates, so that the example needs
// no code generator. Its messages are protobuf's own BytesValue.
//
//	service Echo {
//	  rpc Echo(google.protobuf.BytesValue) returns (google.protobuf.BytesValue);
//	  rpc Stream(stream google.protobuf.BytesValue) returns (stream google.protobuf.BytesValue);
//	}
package echopb

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// ServiceName is the service's full name.
const ServiceName = "rdmacm.example.Echo"

// Server is what a server of the service implements.
type Server interface {
	// Echo returns its request.
	Echo(context.Context, *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error)
	// Stream sends back every message it receives, until the client
	// closes its side.
	Stream(grpc.BidiStreamingServer[wrapperspb.BytesValue, wrapperspb.BytesValue]) error
}

// Register registers srv on s.
func Register(s grpc.ServiceRegistrar, srv Server) { s.RegisterService(&serviceDesc, srv) }

var serviceDesc = grpc.ServiceDesc{
	ServiceName: ServiceName,
	HandlerType: (*Server)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Echo",
		Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.BytesValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			if interceptor == nil {
				return srv.(Server).Echo(ctx, in)
			}
			info := &grpc.UnaryServerInfo{Server: srv, FullMethod: "/" + ServiceName + "/Echo"}
			return interceptor(ctx, in, info, func(ctx context.Context, req any) (any, error) {
				return srv.(Server).Echo(ctx, req.(*wrapperspb.BytesValue))
			})
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName: "Stream",
		Handler: func(srv any, stream grpc.ServerStream) error {
			return srv.(Server).Stream(&grpc.GenericServerStream[wrapperspb.BytesValue, wrapperspb.BytesValue]{ServerStream: stream})
		},
		ServerStreams: true,
		ClientStreams: true,
	}},
}

// Client calls the service.
type Client struct{ cc grpc.ClientConnInterface }

// NewClient is a client of the service on cc.
func NewClient(cc grpc.ClientConnInterface) *Client { return &Client{cc} }

// Echo calls Echo.
func (c *Client) Echo(ctx context.Context, in *wrapperspb.BytesValue, opts ...grpc.CallOption) (*wrapperspb.BytesValue, error) {
	out := new(wrapperspb.BytesValue)
	if err := c.cc.Invoke(ctx, "/"+ServiceName+"/Echo", in, out, opts...); err != nil {
		return nil, err
	}
	return out, nil
}

// Stream opens a Stream call.
func (c *Client) Stream(ctx context.Context, opts ...grpc.CallOption) (grpc.BidiStreamingClient[wrapperspb.BytesValue, wrapperspb.BytesValue], error) {
	s, err := c.cc.NewStream(ctx, &serviceDesc.Streams[0], "/"+ServiceName+"/Stream", opts...)
	if err != nil {
		return nil, err
	}
	return &grpc.GenericClientStream[wrapperspb.BytesValue, wrapperspb.BytesValue]{ClientStream: s}, nil
}
