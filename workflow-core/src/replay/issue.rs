//! Taking the commands the workflow issues: each is matched against the next recorded command
//! (replayed, or a divergence) or, past the history, recorded and started live.

use std::time::SystemTime;

use super::{Attempts, Command, Due, Effect, Key, Patches, Recorded, RecordedCommand, Replay};
use crate::divergence::{Divergence, DivergenceKind};
use crate::history::{to_millis, Event, NewEvent};

impl<S> Replay<S> {
    /// Takes the commands the workflow issued in one poll, in issue order: matches them
    /// against the history and decides what each needs (recording, an attempt, a timer, a
    /// claim). On a divergence nothing of these commands is kept for writing.
    pub(crate) fn issue(
        &mut self,
        commands: impl IntoIterator<Item = Command<S>>,
        now: SystemTime,
    ) -> Result<(), Divergence> {
        for cmd in commands {
            let (hook_key, token) = match cmd {
                Command::HookRelease { hook_key, token } => (hook_key, token),
                Command::Patch { patch_id } => {
                    self.issue_patch(patch_id, now)?;
                    continue;
                }
                Command::SetEvent { set_id, key, value } => {
                    if self.published.insert(set_id) {
                        self.record(NewEvent {
                            at: now,
                            event: Event::EventSet {
                                set_id: set_id.to_string(),
                                key,
                                value,
                            },
                        });
                    }
                    continue;
                }
                Command::Reply {
                    request_id,
                    name,
                    reply,
                } => {
                    if self.replied.insert(request_id) {
                        self.record(NewEvent {
                            at: now,
                            event: Event::RequestReplied {
                                request_id,
                                name,
                                reply,
                            },
                        });
                    }
                    continue;
                }
                Command::AwaitChild { child_id } => {
                    // Delivered from the history when recorded there; otherwise recorded
                    // when its end arrives ([`Replay::deliver_child_end`]).
                    self.waiting.insert(Key::ChildEnd(child_id));
                    continue;
                }
                cmd => {
                    self.issue_one(cmd, now)?;
                    continue;
                }
            };
            // Releases are not results: each is recorded once, and a recorded one is skipped.
            if self.released.insert(hook_key) {
                self.record(NewEvent {
                    at: now,
                    event: Event::HookReleased {
                        hook_key: hook_key.to_string(),
                        token: token.clone(),
                    },
                });
                self.releases.push(token);
            }
        }
        Ok(())
    }

    /// A patch marker: matched against the history, or recorded when the run is live.
    fn issue_patch(&mut self, patch_id: String, now: SystemTime) -> Result<(), Divergence> {
        let cmd: Command<S> = Command::Patch { patch_id };
        if self.match_recorded(&cmd)?.is_none() {
            if let Command::Patch { patch_id } = cmd {
                self.record(NewEvent {
                    at: now,
                    event: Event::PatchMarked { patch_id },
                });
            }
        }
        Ok(())
    }

    /// Matches `cmd` against the next recorded command: the one it replays, `None` when the
    /// history has no more (the command is live), or the divergence (and then nothing of the
    /// commands issued in this poll is kept for writing).
    fn match_recorded(&mut self, cmd: &Command<S>) -> Result<Option<&Recorded>, Divergence> {
        let Some(rec) = self.recorded.get(self.matched) else {
            return Ok(None);
        };
        if !rec.what.matches(cmd) {
            let divergence = Divergence::new(
                DivergenceKind::Command,
                rec.seq,
                rec.what.describe(),
                cmd.describe(),
            );
            self.clear_writes();
            return Err(divergence);
        }
        self.matched += 1;
        Ok(self.recorded.get(self.matched - 1))
    }

    /// Where the history's patch markers stand among its recorded commands, for the
    /// workflow's `patched` to answer without waiting for the core.
    pub(crate) fn patches(&self) -> Patches {
        Patches {
            recorded: self.recorded.len(),
            markers: self
                .recorded
                .iter()
                .enumerate()
                .filter_map(|(i, r)| match &r.what {
                    RecordedCommand::Patch { patch_id } => Some((i, patch_id.clone())),
                    _ => None,
                })
                .collect(),
        }
    }

    fn issue_one(&mut self, cmd: Command<S>, now: SystemTime) -> Result<(), Divergence> {
        let key = match &cmd {
            Command::Step(call) => Key::Step(call.step_id.clone()),
            Command::Timer { timer_id, .. } => Key::Timer(*timer_id),
            Command::HookRegister { hook_key, .. } => Key::Hook(*hook_key),
            Command::StartChild(call) => Key::Child(call.child_key),
            Command::HookRelease { .. }
            | Command::Patch { .. }
            | Command::AwaitChild { .. }
            | Command::SetEvent { .. }
            | Command::Reply { .. } => return Ok(()),
        };
        let (replayed, recorded_fire_at) = match self.match_recorded(&cmd)? {
            Some(rec) => match rec.what {
                RecordedCommand::Timer { fire_at, .. } => (true, Some(fire_at)),
                _ => (true, None),
            },
            None => (false, None),
        };
        let resolved = replayed && self.recorded_results.contains(&key);
        self.waiting.insert(key);
        if resolved {
            // Its result comes from the history, in order.
            return Ok(());
        }
        match cmd {
            Command::Step(call) => {
                let attempts = if replayed {
                    self.attempts
                        .get(&call.step_id)
                        .copied()
                        .unwrap_or_default()
                } else {
                    self.record(NewEvent {
                        at: now,
                        event: Event::StepScheduled {
                            step_id: call.step_id.to_string(),
                            name: call.name.to_owned(),
                            input: call.input.clone(),
                        },
                    });
                    Attempts::default()
                };
                self.start_step(call, attempts, now);
            }
            Command::Timer { timer_id, fire_at } => {
                let fire_at = match recorded_fire_at {
                    Some(at) => at,
                    None => {
                        self.record(NewEvent {
                            at: now,
                            event: Event::TimerScheduled {
                                timer_id: timer_id.to_string(),
                                fire_at_ms: to_millis(fire_at),
                            },
                        });
                        fire_at
                    }
                };
                self.due.insert((fire_at, Due::Timer(timer_id)));
            }
            Command::HookRegister { hook_key, token } => {
                self.effects.push_back(Effect::Claim { hook_key, token });
            }
            Command::StartChild(call) => {
                let child_key = call.child_key;
                self.children.insert(child_key, call);
                self.effects.push_back(Effect::StartChild { child_key });
            }
            Command::HookRelease { .. }
            | Command::Patch { .. }
            | Command::AwaitChild { .. }
            | Command::SetEvent { .. }
            | Command::Reply { .. } => {}
        }
        Ok(())
    }
}
