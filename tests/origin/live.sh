# A live HLS origin for the tests and benchmarks of live streams through a cache
# (sourced after bench/lib.sh and tests/origin/lib.sh, and after start_work, which
# sets `work` and `pids`; not run; needs root).
#
# live_origin_up: the origin rig (origin_up, an empty catalogue) with the headers of
# a live packager, `Cache-Control: max-age=1` on playlists and a long max-age on
# segments, and ffmpeg encoding a test source in real time into its `live`
# directory: H.264 and AAC, 2 s segments, a playlist of six. Returns once three
# segments are published. Sets LIVE_DIR (the directory) and LIVE_FFMPEG_PID; ffmpeg
# is one of the rig's processes, stopped by origin_down before it removes the
# directory ffmpeg writes in. ffmpeg's log is $work/ffmpeg.log. Segments are never deleted, so that every one a viewer received
# can be compared with its file. ORIGIN_DELAY_MS as origin_up has it (default 10).
#
# live_linerate_conf ROOT CACHE_DIR: a linerate configuration with the pull-through
# cache in front of the live directory (prefix /live/), its cache in CACHE_DIR, as
# docs/CACHE.md ("Live") recommends: playlists refreshed ahead of their expiry
# (refresh_ahead_percent = 20).
#
# live_published: the segments the origin's playlist names now.
# live_segment_counts [SINCE]: from the origin's log, how many segments were asked
# for how many times, as "REQUESTS:SEGMENTS ..." ("1:40 " when each was asked once).
# live_playlist_requests [SINCE [UNTIL]]: the playlist's requests in the origin's log
# (those logged from SINCE, and before UNTIL, Unix seconds).
# hlsjs_page DIR SOURCE: a page playing SOURCE with hls.js (below).

live_origin_up() {
    # shellcheck disable=SC2034 # read by origin_up
    # The playlist changes every segment: fresh for a second. Segments never change.
    ORIGIN_LOCATIONS='location ~ \.m3u8$ { add_header Cache-Control "max-age=1"; }
        location ~ \.ts$ { add_header Cache-Control "max-age=3600"; }'
    # shellcheck disable=SC2119 # an empty catalogue, filled by ffmpeg below
    origin_up || return 1
    LIVE_DIR=$ORIGIN_ROOT/live
    mkdir -p "$LIVE_DIR"
    # In real time (-re), a keyframe every 2 s so each segment is 2 s; temp_file: a
    # segment or playlist appears whole, renamed into place.
    # shellcheck disable=SC2154 # work: start_work's
    ffmpeg -hide_banner -loglevel error -nostdin -re \
        -f lavfi -i "testsrc2=size=320x180:rate=25" -f lavfi -i "sine=frequency=440:sample_rate=48000" \
        -c:v libx264 -preset ultrafast -tune zerolatency -g 50 -keyint_min 50 -sc_threshold 0 -b:v 300k \
        -c:a aac -b:a 64k \
        -f hls -hls_time 2 -hls_list_size 6 -hls_flags temp_file+program_date_time+independent_segments \
        -hls_segment_filename "$LIVE_DIR/seg%05d.ts" "$LIVE_DIR/stream.m3u8" > "$work/ffmpeg.log" 2>&1 &
    LIVE_FFMPEG_PID=$!
    origin_writer "$LIVE_FFMPEG_PID"
    local _
    for _ in $(seq 1 200); do
        [ "$(live_published)" -ge 3 ] && return 0
        kill -0 "$LIVE_FFMPEG_PID" 2>/dev/null || break
        sleep 0.1
    done
    cat "$work/ffmpeg.log" >&2
    echo "live: ffmpeg did not publish three segments in 20 s" >&2
    return 1
}

live_published() { grep -c '^seg' "$LIVE_DIR/stream.m3u8" 2>/dev/null || echo 0; }

live_linerate_conf() {
    origin_linerate_conf "$1" /live/ "${ORIGIN_URL}live/" "$2" 500_000_000 | sed '/^urls = /a refresh_ahead_percent = 20'
}

live_segment_counts() {
    awk -F'\t' -v s="${1:-0}" '$1 >= s && $2 ~ /\/live\/seg[0-9]+\.ts / { split($2, r, " "); n[r[2]]++ }
        END { for (k in n) { c[n[k]]++ } ; for (k in c) printf "%s:%s ", k, c[k] }' "$ORIGIN_LOG"
}

live_playlist_requests() {
    awk -F'\t' -v s="${1:-0}" -v u="${2:-1e18}" '$1 >= s && $1 < u && $2 ~ /\/live\/stream\.m3u8 / { n++ } END { print n + 0 }' "$ORIGIN_LOG"
}

# The player of the HLS tests (stable release, fetched once into target/tools).
HLSJS_VERSION=1.6.15

# hlsjs_page DIR SOURCE: DIR/index.html, a page that plays SOURCE (a path on the same
# host) with hls.js (its defaults: low-latency mode on, so an LL-HLS playlist is
# followed part by part with blocking reloads), and hls.min.js beside it, fetched
# from the npm registry once into target/tools. The page's window.state() is what
# tests/origin/live_player.py samples.
hlsjs_page() {
    local dir=$1 src=$2 tools=target/tools/hls.js-$HLSJS_VERSION tmp
    if [ ! -s "$tools/hls.min.js" ]; then
        echo "fetching hls.js $HLSJS_VERSION from the npm registry (once)" >&2
        tmp=$(mktemp -d "${work:-${TMPDIR:-/tmp}}/npm.XXXXXX")
        mkdir -p "$tools"
        (cd "$tmp" && npm pack -q "hls.js@$HLSJS_VERSION" > /dev/null && tar xzf "hls.js-$HLSJS_VERSION.tgz" package/dist/hls.min.js) &&
            mv "$tmp/package/dist/hls.min.js" "$tools/hls.min.js" ||
            { rm -rf "$tmp"; echo "cannot fetch hls.js $HLSJS_VERSION with npm" >&2; return 1; }
        rm -rf "$tmp"
    fi
    mkdir -p "$dir"
    cp "$tools/hls.min.js" "$dir/"
    sed "s|@SOURCE@|$src|" > "$dir/index.html" <<'HTML'
<!doctype html>
<meta charset="utf-8">
<title>live</title>
<video id="v" muted autoplay playsinline></video>
<script src="hls.min.js"></script>
<script>
const v = document.getElementById("v");
const s = { started: false, stalled: false, waiting: 0, fatal: null, errors: [] };
const hls = new Hls();
hls.on(Hls.Events.ERROR, (_, d) => {
    if (d.fatal) s.fatal = d.details;
    if (s.errors.length < 10) s.errors.push(d.details);
});
// A rebuffer is playback stopping for want of data once it has started: the first
// `waiting` after `playing`. More `waiting` events before it plays again (the
// player nudging the playhead over a gap) are the same rebuffer.
v.addEventListener("playing", () => { s.started = true; s.stalled = false; });
v.addEventListener("waiting", () => { if (s.started && !s.stalled) s.waiting++; s.stalled = true; });
hls.loadSource("@SOURCE@");
hls.attachMedia(v);
hls.on(Hls.Events.MANIFEST_PARSED, () => v.play());
window.state = () => ({ t: v.currentTime, started: s.started, waiting: s.waiting, err: v.error ? v.error.code : 0,
    fatal: s.fatal, errors: s.errors, latency: hls.latency });
</script>
HTML
}
