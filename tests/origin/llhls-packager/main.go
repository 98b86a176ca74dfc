// A low-latency HLS packager for the tests: MPEG-TS (H.264) on UDP in, LL-HLS out
// over HTTP, made by gohlslib's muxer (fMP4 segments cut into parts, preload
// hints, blocking playlist reload with _HLS_msn/_HLS_part, delta updates with
// _HLS_skip), as a live origin in front of an encoder makes them.
//
// Usage: llhls-packager --listen ADDR --udp ADDR
// Prints "listening http://ADDR/" once it accepts connections.
package main

import (
	"flag"
	"log"
	"net"
	"net/http"
	"time"

	"github.com/bluenviron/gohlslib"
	"github.com/bluenviron/gohlslib/pkg/codecs"
	"github.com/bluenviron/mediacommon/pkg/formats/mpegts"
)

// udpReader reads one datagram per Read, as the MPEG-TS reader wants.
type udpReader struct{ net.PacketConn }

func (r udpReader) Read(p []byte) (int, error) {
	n, _, err := r.ReadFrom(p)
	return n, err
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "the HTTP address")
	udp := flag.String("udp", "127.0.0.1:9000", "the UDP address MPEG-TS comes to")
	flag.Parse()
	log.SetFlags(0)

	mux := &gohlslib.Muxer{
		VideoTrack:         &gohlslib.Track{Codec: &codecs.H264{}},
		Variant:            gohlslib.MuxerVariantLowLatency,
		SegmentMinDuration: time.Second,
		PartMinDuration:    200 * time.Millisecond,
	}
	if err := mux.Start(); err != nil {
		log.Fatal(err)
	}
	pc, err := net.ListenPacket("udp", *udp)
	if err != nil {
		log.Fatal(err)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("listening http://%s/", ln.Addr())
	go func() { log.Fatal(http.Serve(ln, http.HandlerFunc(mux.Handle))) }()

	r, err := mpegts.NewReader(mpegts.NewBufferedReader(udpReader{pc}))
	if err != nil {
		log.Fatal(err)
	}
	var dec *mpegts.TimeDecoder
	found := false
	for _, t := range r.Tracks() {
		if _, ok := t.Codec.(*mpegts.CodecH264); ok {
			r.OnDataH26x(t, func(raw int64, _ int64, au [][]byte) error {
				if dec == nil {
					dec = mpegts.NewTimeDecoder(raw)
				}
				return mux.WriteH26x(time.Now(), dec.Decode(raw), au)
			})
			found = true
			break
		}
	}
	if !found {
		log.Fatal("no H.264 track in the input")
	}
	for {
		if err := r.Read(); err != nil {
			log.Fatal(err)
		}
	}
}
