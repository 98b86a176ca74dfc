//! A live viewer (`--live`): one play of the stream for the whole run, on the
//! session's one kept-alive connection. It loads the media playlist, joins three
//! target durations behind the live edge, then alternates between reloading the
//! playlist when `live::next_reload` says and fetching, in order and once each,
//! the segments the `live::Follower` queued. Its playback is the `Playback` model
//! with each segment's own `EXTINF` duration: the segments it joined with are the
//! start-up buffer, a segment arriving after the buffer ran dry is a rebuffer.

use std::time::{Duration, Instant, SystemTime};

use tokio::time::sleep_until;

use super::{Request, Session, Stop, Timing};
use crate::live::{next_reload, Follower};
use crate::m3u8;
use crate::playback::Playback;
use crate::response::Expect;
use crate::stats::{ErrorKind, WorkerStats};

impl Session {
    pub(super) async fn watch_live(&mut self) {
        let ctx = self.ctx.clone();
        let plan = ctx.plan.clone();
        let began = plan.since_start(Instant::now());
        let mut follower = Follower::default();
        let mut playback: Option<Playback> = None;
        // Start-up segments not yet fetched (left out of the latency histograms:
        // they were published before the viewer joined).
        let mut startup_left = 0usize;
        let mut previous: Option<Vec<u8>> = None;
        // Until the first playlist says.
        let mut target = Duration::from_secs(1);
        let mut reload_at = began;
        let mut ended = false;
        let mut failures = 0u32;
        let mut fetched = 0u64;
        while Instant::now() < plan.end {
            let now = plan.since_start(Instant::now());
            if !ended && now >= reload_at {
                let load_began = now;
                let playlist = match self.load_playlist().await {
                    Ok(p) => p,
                    Err(Stop::Ended) => break,
                    Err(Stop::Failed) => {
                        reload_at = load_began + target / 2;
                        continue;
                    }
                };
                let arrived = plan.since_start(Instant::now());
                let (text, parsed) = playlist;
                match parsed {
                    Ok(p) => {
                        let changed = previous.as_ref() != Some(&text);
                        previous = Some(text);
                        target = p.target_duration;
                        ended = p.ended;
                        let skipped = follower.update(&p, arrived);
                        ctx.stats.borrow_mut().skipped_segments += skipped;
                        if playback.is_none() && follower.len() > 0 {
                            startup_left = follower.len();
                            let startup = u32::try_from(startup_left).unwrap_or(u32::MAX);
                            playback = Some(Playback::new(target, startup, u32::MAX, began));
                        }
                        reload_at = next_reload(load_began, changed, target);
                    }
                    Err(why) => {
                        let url = &plan.live.as_ref().expect("a live run").url;
                        self.fail(ErrorKind::Playlist, || format!("{url}: {why}"));
                        reload_at = load_began + target / 2;
                    }
                }
                continue;
            }
            let Some(seg) = follower.next().cloned() else {
                // Nothing to fetch: wait for the next reload (or the end).
                let wake = if ended { plan.end } else { plan.at(reload_at).min(plan.end) };
                sleep_until(wake.into()).await;
                continue;
            };
            let playback = playback.as_mut().expect("segments are queued once playback exists");
            let stream = plan.live.as_ref().expect("a live run");
            let target = match m3u8::resolve(stream.scheme, &stream.authority, &stream.target, &seg.uri) {
                Ok(t) => t,
                Err(why) => {
                    // Not fetchable here: an error, and the viewer goes on without it.
                    self.fail(ErrorKind::Playlist, || format!("{}: {why}", stream.url));
                    follower.fetched();
                    continue;
                }
            };
            match self.fetch_live(&target).await {
                Ok(t) => {
                    follower.fetched();
                    fetched += 1;
                    let at = plan.since_start(t.done);
                    let late = playback.arrived_lasting(at, true, seg.duration);
                    self.segment_arrived(at, late, &mut failures);
                    if startup_left > 0 {
                        startup_left -= 1;
                    } else {
                        let mut stats = ctx.stats.borrow_mut();
                        WorkerStats::record(&mut stats.listed_usecs, at.saturating_sub(seg.listed_at));
                        if let Some(pdt) = seg.program_date_time {
                            let latency = SystemTime::now().duration_since(pdt).unwrap_or_default();
                            WorkerStats::record(&mut stats.live_latency_usecs, latency);
                        }
                    }
                }
                Err(Stop::Ended) => break,
                // A due reload is not held up by the back-off beyond its time.
                Err(Stop::Failed) => self.back_off(&mut failures, plan.at(reload_at).max(Instant::now())).await,
            }
        }
        if failures > 0 {
            ctx.stats.borrow_mut().unrecovered_segments += 1;
        }
        ctx.stats.borrow_mut().count_viewer_segments(fetched);
        match playback {
            Some(p) => self.end_play(p, true),
            // Never got a playlist with a segment: a play that never started.
            None => self.end_play(Playback::new(target, 1, 1, began), true),
        }
    }

    /// GETs the media playlist: its text and what parsing it gave.
    async fn load_playlist(&mut self) -> Result<(Vec<u8>, Result<m3u8::MediaPlaylist, String>), Stop> {
        let ctx = self.ctx.clone();
        let stream = ctx.plan.live.as_ref().expect("a live run");
        self.request.clear();
        self.request.extend_from_slice(&stream.request_for(&stream.target));
        let mut text = Vec::new();
        let what = Request { origin: stream.origin, expect: Expect::Whole, label: &stream.url, offset: 0 };
        let result = self
            .request(what, &mut |body, _| {
                text.extend_from_slice(body);
                true
            })
            .await;
        ctx.stats.borrow_mut().playlist_requests += 1;
        ctx.live.add_request();
        result?;
        let parsed = match std::str::from_utf8(&text) {
            Ok(t) => m3u8::parse(t),
            Err(_) => Err("not UTF-8".to_owned()),
        };
        Ok((text, parsed))
    }

    /// GETs the segment at request target `target` on the stream's origin.
    async fn fetch_live(&mut self, target: &str) -> Result<Timing, Stop> {
        let ctx = self.ctx.clone();
        let stream = ctx.plan.live.as_ref().expect("a live run");
        self.request.clear();
        self.request.extend_from_slice(&stream.request_for(target));
        let label = format!("{}://{}{target}", stream.scheme, stream.authority);
        let what = Request { origin: stream.origin, expect: Expect::Whole, label: &label, offset: 0 };
        let timing = self
            .request(what, &mut |body, _| {
                ctx.count_body(body.len() as u64);
                true
            })
            .await?;
        self.record_segment(false, &timing);
        Ok(timing)
    }
}
