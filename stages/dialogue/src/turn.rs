//! Turn-taking and barge-in: the `turn` stage of a voice loop.
//!
//! The stage sits between speech recognition and the thinker. It hears the
//! user through the VAD's events and the ASR's transcripts, and the agent
//! through two feedback taps (the TTS audio and the thinker's end-of-answer
//! flush). From those it decides three things:
//!
//! * **End of the user's turn.** A transcript is held until the user has
//!   been silent for `end_of_turn_silence_ms` after the VAD's `SpeechEnd`;
//!   speech that resumes within that window continues the same turn (the
//!   transcripts are joined). Then the text goes to the thinker.
//! * **Epochs.** Handing a turn to the thinker starts a new epoch
//!   ([`StageCtx::new_epoch`]): the answer (thinker text, TTS audio, the
//!   speaker's queue) runs in the epoch the user's turn was captured in,
//!   and everything the microphone captures from then on (the next thing
//!   the user says) is in a fresh epoch. So cancelling the agent's epoch
//!   never touches the user's next utterance.
//! * **Barge-in.** When the user speaks while the agent's turn is active
//!   (thinking, or its audio still playing) for at least
//!   `min_interrupt_ms`, the stage cancels the agent's epoch
//!   ([`StageCtx::cancel_epoch`]): queued messages of that epoch are dropped
//!   everywhere, the thinker and TTS stop at their next step, the speaker
//!   flushes its buffer, and every stage acknowledges (the engine records
//!   the acknowledgement time under `cancels`). Shorter speech while the
//!   agent is active (a backchannel such as "mm-hmm", a cough) does not
//!   interrupt, and its transcript is dropped.
//!
//! ## Ports
//!
//! | port | type | from |
//! |---|---|---|
//! | in `events` | control | `vad.events` (SpeechStart / SpeechEnd) |
//! | in `transcript` | text | `asr.text` |
//! | in `agent_audio` | audio, optional | a tap of the TTS output (`back_edge: true`) |
//! | in `agent_done` | control, optional | `thinker.done` (`back_edge: true`) |
//! | in `tick` | control, optional | a `timer` (e.g. 50 Hz) |
//! | out `text` | text | to the thinker: one message per user turn |
//!
//! The two agent inputs close a loop (turn -> thinker -> ... -> turn), so
//! their edges are declared `back_edge: true`. The speaker stage emits no
//! "first audio" signal, so voice-to-voice latency is measured where the
//! TTS audio reaches this stage: it excludes the speaker's jitter buffer and
//! the device latency, which the speaker reports as `playout_latency_ms`.
//! Without `tick`, time-based decisions (the end-of-turn hold, the
//! interruption threshold) are taken only when some message arrives; a
//! timer makes them prompt.
//!
//! ## Metrics
//!
//! * `voice_to_voice_ms`: the VAD's `SpeechEnd` (capture time of the audio
//!   in which the end was detected) to the first TTS audio of the answer.
//! * `interruption_latency_ms`: capture time of the interrupting
//!   `SpeechStart` to the cancel being issued (at least `min_interrupt_ms`).
//! * `handoff_ms`: `SpeechEnd` to the transcript going to the thinker
//!   (ASR time and the end-of-turn hold).
//! * `turns`, `barge_ins`, `backchannels`: 1 per event (the count is the
//!   summary's count).

use edgeflow_graph::{
    BuildEnv, Epoch, Event, Input, Message, ParamInfo, ParamType, Params, Payload, PortSpec,
    PortType, Ports, Stage, StageCtx, StageError, StageFactory, StageInfo, StageResult, Timestamp,
};
use std::time::Duration;

/// Input port indices of the `turn` stage.
const IN_EVENTS: usize = 0;
const IN_TRANSCRIPT: usize = 1;
const IN_AGENT_AUDIO: usize = 2;
const IN_AGENT_DONE: usize = 3;
/// Output port index of the user's turn text.
const OUT_TEXT: usize = 0;

/// Turn-handling settings. Defaults follow LiveKit Agents'.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TurnConfig {
    /// Speech must last this long while the agent's turn is active to
    /// interrupt it (LiveKit `min_interruption_duration`, 0.5 s).
    pub min_interrupt: Duration,
    /// Silence after the VAD's end of speech before the user's turn is
    /// handed to the thinker (LiveKit `min_endpointing_delay`, 0.5 s).
    pub end_of_turn_silence: Duration,
    /// After the agent's last audio is estimated to have played, the agent
    /// still counts as speaking for this long (the speaker's jitter buffer
    /// and device latency).
    pub playout_tail: Duration,
}

impl Default for TurnConfig {
    fn default() -> Self {
        TurnConfig {
            min_interrupt: Duration::from_millis(500),
            end_of_turn_silence: Duration::from_millis(500),
            playout_tail: Duration::from_millis(250),
        }
    }
}

/// What [`TurnLogic`] asks its stage to do.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnAction {
    /// Hand the user's turn to the thinker and start a new epoch.
    HandOff {
        /// The user's words (transcripts of the turn joined by spaces).
        text: String,
        /// When the user's speech ended (the VAD's `SpeechEnd`).
        speech_end: Timestamp,
    },
    /// Cancel the agent's turn (barge-in).
    Cancel {
        /// The agent's epoch.
        epoch: Epoch,
        /// Capture time of the interrupting `SpeechStart` to now.
        latency: Duration,
    },
    /// The first audio of the agent's answer arrived.
    FirstAudio {
        /// The user's `SpeechEnd` to now.
        voice_to_voice: Duration,
    },
    /// A short utterance during the agent's turn was ignored.
    Backchannel,
}

/// One span of user speech.
#[derive(Debug, Clone, Copy)]
struct Speech {
    start: Timestamp,
    /// The agent's turn was active when it began or while it lasted.
    during_agent: bool,
    /// It interrupted the agent.
    interrupted: bool,
}

/// Transcripts waiting for the end-of-turn silence.
#[derive(Debug, Clone)]
struct Pending {
    text: String,
    epoch: Epoch,
}

/// The agent's turn in progress.
#[derive(Debug, Clone, Copy)]
struct AgentTurn {
    epoch: Epoch,
    /// The user's end of speech that started it.
    speech_end: Timestamp,
    first_audio: bool,
    /// Estimated end of playback of the audio received so far.
    play_end: Option<Timestamp>,
    /// The thinker finished its answer.
    done: bool,
}

/// The turn-taking state machine, free of any pipeline so it can be driven
/// by synthetic events (its unit tests do). Feed it events with their
/// times, then call [`TurnLogic::poll`] for the actions that are due.
#[derive(Debug, Clone)]
pub struct TurnLogic {
    cfg: TurnConfig,
    speech: Option<Speech>,
    /// Kind of the last finished speech span, for its transcript.
    last: Option<Speech>,
    last_end: Option<Timestamp>,
    pending: Option<Pending>,
    agent: Option<AgentTurn>,
}

impl TurnLogic {
    /// A state machine with these settings.
    pub fn new(cfg: TurnConfig) -> Self {
        TurnLogic {
            cfg,
            speech: None,
            last: None,
            last_end: None,
            pending: None,
            agent: None,
        }
    }

    /// The settings.
    pub fn config(&self) -> &TurnConfig {
        &self.cfg
    }

    /// The agent's epoch while its turn is in progress (thinking or audio
    /// still playing at `now`).
    pub fn agent_active(&self, now: Timestamp) -> Option<Epoch> {
        let a = self.agent.as_ref()?;
        if !a.done {
            return Some(a.epoch);
        }
        match a.play_end {
            Some(end) if now <= later(end, self.cfg.playout_tail) => Some(a.epoch),
            _ => None,
        }
    }

    /// Whether the user is speaking (between SpeechStart and SpeechEnd).
    pub fn user_speaking(&self) -> bool {
        self.speech.is_some()
    }

    /// The VAD reported the start of speech, captured at `at`.
    pub fn speech_start(&mut self, at: Timestamp, now: Timestamp) {
        self.speech = Some(Speech {
            start: at,
            during_agent: self.agent_active(now).is_some(),
            interrupted: false,
        });
    }

    /// The VAD reported the end of speech, captured at `at`.
    pub fn speech_end(&mut self, at: Timestamp) {
        self.last = self.speech.take();
        self.last_end = Some(at);
    }

    /// A transcript of the last utterance arrived (in `epoch`). Returns a
    /// [`TurnAction::Backchannel`] when it is dropped as one.
    pub fn transcript(&mut self, epoch: Epoch, text: &str) -> Option<TurnAction> {
        let text = text.trim();
        if text.is_empty() {
            return None;
        }
        if let Some(s) = self.last {
            if s.during_agent && !s.interrupted {
                return Some(TurnAction::Backchannel);
            }
        }
        match &mut self.pending {
            Some(p) => {
                p.text.push(' ');
                p.text.push_str(text);
                p.epoch = epoch;
            }
            None => {
                self.pending = Some(Pending {
                    text: text.to_string(),
                    epoch,
                })
            }
        }
        None
    }

    /// The turn in `epoch` went to the thinker (after a
    /// [`TurnAction::HandOff`]): the agent's turn starts.
    pub fn agent_started(&mut self, epoch: Epoch, speech_end: Timestamp) {
        self.agent = Some(AgentTurn {
            epoch,
            speech_end,
            first_audio: false,
            play_end: None,
            done: false,
        });
    }

    /// Agent audio of `duration` in `epoch` was produced at `now`.
    pub fn agent_audio(
        &mut self,
        epoch: Epoch,
        duration: Duration,
        now: Timestamp,
    ) -> Option<TurnAction> {
        let a = self.agent.as_mut().filter(|a| a.epoch == epoch)?;
        let start = match a.play_end {
            Some(end) if end > now => end,
            _ => now,
        };
        a.play_end = Some(later(start, duration));
        if a.first_audio {
            return None;
        }
        a.first_audio = true;
        Some(TurnAction::FirstAudio {
            voice_to_voice: Duration::from_nanos(now.0.saturating_sub(a.speech_end.0)),
        })
    }

    /// The thinker finished the answer of `epoch`.
    pub fn agent_done(&mut self, epoch: Epoch) {
        if let Some(a) = self.agent.as_mut().filter(|a| a.epoch == epoch) {
            a.done = true;
        }
    }

    /// `epoch` was cancelled (by this stage or anyone else): forget what
    /// belongs to it.
    pub fn cancelled(&mut self, epoch: Epoch) {
        if self.agent.is_some_and(|a| a.epoch == epoch) {
            self.agent = None;
        }
        if self.pending.as_ref().is_some_and(|p| p.epoch == epoch) {
            self.pending = None;
        }
    }

    /// The actions due at `now`: a barge-in, then a hand-off.
    pub fn poll(&mut self, now: Timestamp) -> Vec<TurnAction> {
        let mut out = Vec::new();
        let active = self.agent_active(now);
        if let Some(s) = self.speech.as_mut() {
            if let Some(epoch) = active {
                s.during_agent = true;
                let spoken = Duration::from_nanos(now.0.saturating_sub(s.start.0));
                if !s.interrupted && spoken >= self.cfg.min_interrupt {
                    s.interrupted = true;
                    self.agent = None;
                    out.push(TurnAction::Cancel {
                        epoch,
                        latency: spoken,
                    });
                }
            }
        }
        if self.speech.is_none() {
            if let (Some(end), true) = (self.last_end, self.pending.is_some()) {
                if now >= later(end, self.cfg.end_of_turn_silence) {
                    if let Some(p) = self.pending.take() {
                        out.push(TurnAction::HandOff {
                            text: p.text,
                            speech_end: end,
                        });
                    }
                }
            }
        }
        out
    }
}

/// The `turn` stage kind.
#[derive(Debug)]
pub struct TurnKind;

fn ms_param(p: &Params, key: &str, default: f64, max: f64) -> StageResult<Duration> {
    let v: f64 = p.get_or(key, default)?;
    if !(0.0..=max).contains(&v) {
        return Err(p
            .error(key, format!("must be in 0..={max} (milliseconds), got {v}"))
            .into());
    }
    Ok(Duration::from_secs_f64(v / 1000.0))
}

/// Read the stage's params into a [`TurnConfig`].
pub fn turn_config(p: &Params) -> StageResult<TurnConfig> {
    Ok(TurnConfig {
        min_interrupt: ms_param(p, "min_interrupt_ms", 500.0, 10_000.0)?,
        end_of_turn_silence: ms_param(p, "end_of_turn_silence_ms", 500.0, 10_000.0)?,
        playout_tail: ms_param(p, "playout_tail_ms", 250.0, 10_000.0)?,
    })
}

impl StageFactory for TurnKind {
    fn info(&self) -> StageInfo {
        StageInfo {
            kind: "turn",
            doc: "Turn-taking and barge-in for a voice loop: holds the ASR transcript until `end_of_turn_silence_ms` of silence after the VAD's SpeechEnd, hands it to the thinker and starts a new epoch (the answer runs in the user turn's epoch, the next utterance in a fresh one); speech lasting `min_interrupt_ms` while the agent thinks or speaks cancels the agent's epoch (thinker, TTS and speaker stop and acknowledge). Feed `agent_audio` (a TTS tap) and `agent_done` (thinker.done) back with `back_edge: true`. Records `voice_to_voice_ms` (SpeechEnd to first TTS audio), `interruption_latency_ms` (SpeechStart to cancel), `handoff_ms`, `turns`, `barge_ins`, `backchannels`.",
            params: vec![
                ParamInfo::new("min_interrupt_ms", ParamType::Float, 500.0, "speech while the agent is active must last this long (ms) to interrupt it; shorter speech is a backchannel and its transcript is dropped (LiveKit: 500)"),
                ParamInfo::new("end_of_turn_silence_ms", ParamType::Float, 500.0, "silence (ms) after the VAD's SpeechEnd before the transcript goes to the thinker; speech resuming sooner continues the turn (LiveKit min endpointing: 500)"),
                ParamInfo::new("playout_tail_ms", ParamType::Float, 250.0, "the agent counts as speaking this long (ms) after its received audio is estimated to have played (speaker buffer and device latency)"),
            ],
            ports: Ports {
                inputs: vec![
                    PortSpec::new("events", PortType::Control, "Event::SpeechStart / SpeechEnd (vad.events)"),
                    PortSpec::new("transcript", PortType::Text, "the transcript of each utterance (asr.text)"),
                    PortSpec::optional("agent_audio", PortType::AUDIO_ANY, "tap of the agent's TTS audio: first-audio time and playback estimate (back edge)"),
                    PortSpec::optional("agent_done", PortType::Control, "Event::Flush when the thinker's answer is complete (thinker.done, back edge)"),
                    PortSpec::optional("tick", PortType::Control, "timer ticks, so time-based decisions do not wait for the next message"),
                ],
                outputs: vec![PortSpec::new("text", PortType::Text, "the user's turn, one message per turn (to the thinker)")],
            },
            source: false,
        }
    }

    fn build(&self, p: &Params, _env: &BuildEnv) -> StageResult<Box<dyn Stage>> {
        Ok(Box::new(TurnStage {
            logic: TurnLogic::new(turn_config(p)?),
        }))
    }
}

/// The `turn` stage: a [`TurnLogic`] driven by the pipeline.
#[derive(Debug)]
pub struct TurnStage {
    logic: TurnLogic,
}

impl TurnStage {
    /// A stage with these settings.
    pub fn new(cfg: TurnConfig) -> Self {
        TurnStage {
            logic: TurnLogic::new(cfg),
        }
    }

    fn apply(&mut self, actions: Vec<TurnAction>, ctx: &mut StageCtx) -> StageResult {
        for a in actions {
            match a {
                TurnAction::HandOff { text, speech_end } => {
                    // The answer runs in the epoch the user's turn was
                    // captured in; what the microphone hears next is new.
                    let epoch = ctx.current_epoch();
                    ctx.new_epoch();
                    self.logic.agent_started(epoch, speech_end);
                    ctx.record("turns", 1.0);
                    ctx.record("handoff_ms", ms(speech_end.elapsed()));
                    let msg = Message {
                        epoch,
                        seq: 0,
                        timestamp: speech_end,
                        deadline: None,
                        payload: Payload::text(text),
                    };
                    match ctx.emit_msg(OUT_TEXT, msg) {
                        Ok(()) | Err(StageError::Cancelled) => {}
                        Err(e) => return Err(e),
                    }
                }
                TurnAction::Cancel { epoch, latency } => {
                    ctx.cancel_epoch(epoch);
                    ctx.record("barge_ins", 1.0);
                    ctx.record("interruption_latency_ms", ms(latency));
                }
                TurnAction::FirstAudio { voice_to_voice } => {
                    ctx.record("voice_to_voice_ms", ms(voice_to_voice));
                }
                TurnAction::Backchannel => ctx.record("backchannels", 1.0),
            }
        }
        Ok(())
    }
}

/// `t + d` on the pipeline clock.
fn later(t: Timestamp, d: Duration) -> Timestamp {
    Timestamp(t.0.saturating_add(d.as_nanos() as u64))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Stage for TurnStage {
    fn process(&mut self, input: Input, ctx: &mut StageCtx) -> StageResult {
        let msg = &input.msg;
        let now = Timestamp::now();
        let mut actions = Vec::new();
        match (input.port, &msg.payload) {
            (IN_EVENTS, Payload::Event(e)) => match **e {
                Event::SpeechStart => self.logic.speech_start(msg.timestamp, now),
                Event::SpeechEnd => self.logic.speech_end(msg.timestamp),
                _ => {}
            },
            (IN_TRANSCRIPT, Payload::Text(t)) => {
                actions.extend(self.logic.transcript(msg.epoch, t));
            }
            (IN_AGENT_AUDIO, Payload::Audio(a)) => {
                actions.extend(self.logic.agent_audio(msg.epoch, a.duration(), now));
            }
            (IN_AGENT_DONE, Payload::Event(e)) if **e == Event::Flush => {
                self.logic.agent_done(msg.epoch);
            }
            // Ticks (and anything else) only advance time.
            _ => {}
        }
        actions.extend(self.logic.poll(now));
        self.apply(actions, ctx)
    }

    fn reset(&mut self, epoch: Epoch, _ctx: &mut StageCtx) -> StageResult {
        self.logic.cancelled(epoch);
        Ok(())
    }

    fn finish(&mut self, ctx: &mut StageCtx) -> StageResult {
        // End of stream: a turn still waiting for its silence is over.
        let far = later(Timestamp::now(), Duration::from_secs(3600));
        let actions = self
            .logic
            .poll(far)
            .into_iter()
            .filter(|a| matches!(a, TurnAction::HandOff { .. }))
            .collect();
        self.apply(actions, ctx)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn t(ms: u64) -> Timestamp {
        Timestamp(ms * 1_000_000)
    }

    fn logic() -> TurnLogic {
        TurnLogic::new(TurnConfig::default())
    }

    /// The user speaks 0..1000 ms; the transcript arrives at 1300 ms.
    fn user_turn(l: &mut TurnLogic) {
        l.speech_start(t(0), t(0));
        assert!(l.poll(t(500)).is_empty());
        l.speech_end(t(1000));
        assert!(l.transcript(1, " What time is it? ").is_none());
    }

    #[test]
    fn transcript_waits_for_end_of_turn_silence() {
        let mut l = logic();
        user_turn(&mut l);
        assert!(l.poll(t(1300)).is_empty());
        assert!(l.poll(t(1499)).is_empty());
        assert_eq!(
            l.poll(t(1500)),
            vec![TurnAction::HandOff {
                text: "What time is it?".into(),
                speech_end: t(1000)
            }]
        );
        assert!(l.poll(t(1600)).is_empty(), "handed off once");
    }

    #[test]
    fn speech_resuming_within_the_silence_continues_the_turn() {
        let mut l = logic();
        user_turn(&mut l);
        l.speech_start(t(1200), t(1300));
        assert!(l.poll(t(1600)).is_empty(), "user is speaking");
        l.speech_end(t(2000));
        assert!(l.transcript(1, "In Paris.").is_none());
        assert!(l.poll(t(2400)).is_empty());
        assert_eq!(
            l.poll(t(2500)),
            vec![TurnAction::HandOff {
                text: "What time is it? In Paris.".into(),
                speech_end: t(2000)
            }]
        );
    }

    #[test]
    fn empty_transcripts_are_not_turns() {
        let mut l = logic();
        l.speech_start(t(0), t(0));
        l.speech_end(t(200));
        assert!(l.transcript(1, "  ").is_none());
        assert!(l.poll(t(5000)).is_empty());
    }

    #[test]
    fn first_audio_gives_voice_to_voice_once() {
        let mut l = logic();
        user_turn(&mut l);
        l.poll(t(1500));
        l.agent_started(1, t(1000));
        assert_eq!(l.agent_active(t(1600)), Some(1));
        // Audio of another epoch is not ours.
        assert!(l
            .agent_audio(7, Duration::from_millis(100), t(1700))
            .is_none());
        assert_eq!(
            l.agent_audio(1, Duration::from_millis(300), t(1800)),
            Some(TurnAction::FirstAudio {
                voice_to_voice: Duration::from_millis(800)
            })
        );
        assert!(l
            .agent_audio(1, Duration::from_millis(300), t(1900))
            .is_none());
    }

    #[test]
    fn agent_is_active_until_its_audio_has_played() {
        let mut l = logic();
        l.agent_started(3, t(0));
        l.agent_audio(3, Duration::from_millis(1000), t(100));
        l.agent_audio(3, Duration::from_millis(1000), t(200));
        // Two seconds queued from 100 ms: playback ends at 2100 ms.
        l.agent_done(3);
        assert_eq!(l.agent_active(t(2000)), Some(3));
        assert_eq!(l.agent_active(t(2350)), Some(3), "playout tail");
        assert_eq!(l.agent_active(t(2351)), None);
    }

    #[test]
    fn thinking_counts_as_active_until_done() {
        let mut l = logic();
        l.agent_started(2, t(0));
        assert_eq!(l.agent_active(t(60_000)), Some(2));
        l.agent_done(2);
        assert_eq!(l.agent_active(t(60_000)), None, "empty answer");
    }

    #[test]
    fn barge_in_after_min_interrupt_cancels_the_agent_epoch() {
        let mut l = logic();
        l.agent_started(4, t(0));
        l.agent_audio(4, Duration::from_secs(5), t(100));
        l.speech_start(t(1000), t(1020));
        assert!(l.poll(t(1499)).is_empty(), "not yet min_interrupt");
        assert_eq!(
            l.poll(t(1530)),
            vec![TurnAction::Cancel {
                epoch: 4,
                latency: Duration::from_millis(530)
            }]
        );
        assert_eq!(l.agent_active(t(1600)), None);
        assert!(l.poll(t(1700)).is_empty(), "cancelled once");
        // The interrupting utterance is the next turn.
        l.speech_end(t(2500));
        assert!(l.transcript(5, "Stop, tell me a joke.").is_none());
        assert_eq!(
            l.poll(t(3000)),
            vec![TurnAction::HandOff {
                text: "Stop, tell me a joke.".into(),
                speech_end: t(2500)
            }]
        );
    }

    #[test]
    fn short_speech_during_the_agent_is_a_backchannel() {
        let mut l = logic();
        l.agent_started(4, t(0));
        l.agent_audio(4, Duration::from_secs(5), t(100));
        l.speech_start(t(1000), t(1000));
        assert!(l.poll(t(1200)).is_empty());
        l.speech_end(t(1300));
        assert!(l.poll(t(1400)).is_empty(), "too short to interrupt");
        assert_eq!(l.transcript(4, "Mm-hmm."), Some(TurnAction::Backchannel));
        assert!(l.poll(t(3000)).is_empty(), "nothing handed off");
        assert_eq!(l.agent_active(t(3000)), Some(4), "agent goes on");
    }

    #[test]
    fn speech_after_the_agent_finished_is_a_plain_turn() {
        let mut l = logic();
        l.agent_started(4, t(0));
        l.agent_audio(4, Duration::from_millis(500), t(100));
        l.agent_done(4);
        l.speech_start(t(2000), t(2000));
        assert!(l.poll(t(3000)).is_empty(), "no one to interrupt");
        l.speech_end(t(3000));
        assert!(l.transcript(5, "Thanks.").is_none());
        assert_eq!(l.poll(t(3500)).len(), 1);
    }

    #[test]
    fn cancel_from_elsewhere_forgets_the_epoch() {
        let mut l = logic();
        user_turn(&mut l);
        l.cancelled(1);
        assert!(l.poll(t(5000)).is_empty(), "pending turn dropped");
        l.agent_started(2, t(0));
        l.cancelled(2);
        assert_eq!(l.agent_active(t(1)), None);
    }

    /// The stage in a running pipeline, driven by synthetic events from the
    /// host: turns go out in their own epoch, a barge-in cancels the agent's
    /// epoch through the engine and the interruption is the next turn.
    #[test]
    fn stage_hands_off_in_epochs_and_cancels_on_barge_in() {
        use edgeflow_graph::{Pipeline, Registry};
        let mut reg = Registry::builtin();
        reg.register(TurnKind);
        let yaml = r#"
stages:
  - { id: user, kind: host_in }
  - { id: turn, kind: turn, params: { min_interrupt_ms: 0, end_of_turn_silence_ms: 0 } }
  - { id: out, kind: host_out, params: { type: text } }
edges:
  - { from: user.out, to: turn.events }
  - { from: user.out, to: turn.transcript }
  - { from: turn.text, to: out.in }
"#;
        let running = Pipeline::from_yaml(yaml, &reg).unwrap().start().unwrap();
        let wait = Duration::from_secs(10);
        let say = |text: &str| {
            running
                .push("user", Payload::event(Event::SpeechStart))
                .unwrap();
            running
                .push("user", Payload::event(Event::SpeechEnd))
                .unwrap();
            running.push("user", Payload::text(text)).unwrap();
        };
        say("What time is it?");
        let first = running.pull("out", wait).unwrap().unwrap();
        assert_eq!(first.payload.as_text(), Some("What time is it?"));
        assert_eq!(first.epoch, 0, "the answer runs in the turn's epoch");
        assert_eq!(running.current_epoch(), 1, "the next utterance is new");
        // The agent is thinking (no end of answer): speech interrupts it.
        say("Stop.");
        let second = running.pull("out", wait).unwrap().unwrap();
        assert_eq!(second.payload.as_text(), Some("Stop."));
        assert_eq!(second.epoch, 1);
        let m = running.metrics();
        assert_eq!(m.cancels.len(), 1, "{:?}", m.cancels);
        assert_eq!(m.cancels[0].epoch, 0);
        let turn = m.stages.iter().find(|s| s.id == "turn").unwrap();
        assert_eq!(turn.values["barge_ins"].count, 1);
        assert_eq!(turn.values["turns"].count, 2);
        assert_eq!(turn.values["interruption_latency_ms"].count, 1);
    }

    #[test]
    fn params_are_milliseconds_with_livekit_defaults() {
        let p = Params::new("turn", Default::default());
        assert_eq!(turn_config(&p).unwrap(), TurnConfig::default());
        let mut p = Params::new("turn", Default::default());
        p.set("min_interrupt_ms", serde_json::json!(300));
        p.set("end_of_turn_silence_ms", serde_json::json!(250.5));
        let c = turn_config(&p).unwrap();
        assert_eq!(c.min_interrupt, Duration::from_millis(300));
        assert_eq!(c.end_of_turn_silence, Duration::from_micros(250_500));
        p.set("playout_tail_ms", serde_json::json!(-1));
        let e = turn_config(&p).unwrap_err().to_string();
        assert!(e.contains("playout_tail_ms"), "{e}");
    }
}
