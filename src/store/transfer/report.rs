//! What a move counted, kind by kind, and the tasks it found in flight.

use crate::store::postgres::TableRows;

/// A kind of stored data the move copies, in the order it copies them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Secrets = 0,
    Identities,
    ToolHeaders,
    Tasks,
    SeenMarks,
    Tombstones,
    Claims,
    Sessions,
}

impl Kind {
    /// Every kind, in the order the move copies them: secrets first (a conflicting
    /// MRTR key is refused before anything else is written), read marks after their
    /// tasks (a mark needs its task), claims after the tasks and tombstones they name.
    pub const ALL: [Kind; 8] = [
        Self::Secrets,
        Self::Identities,
        Self::ToolHeaders,
        Self::Tasks,
        Self::SeenMarks,
        Self::Tombstones,
        Self::Claims,
        Self::Sessions,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Secrets => "store secrets",
            Self::Identities => "upstream identities",
            Self::ToolHeaders => "upstream tool headers",
            Self::Tasks => "tasks",
            Self::SeenMarks => "read marks",
            Self::Tombstones => "tombstones",
            Self::Claims => "idempotency claims",
            Self::Sessions => "legacy sessions",
        }
    }

    /// Whether a row the destination holds with other content stops the move (see
    /// `store::postgres::import`): facts a move must not change. The others are
    /// rewritten on every change, and the destination's row, newer, is kept.
    pub fn strict(self) -> bool {
        matches!(
            self,
            Self::Secrets | Self::Tasks | Self::Tombstones | Self::Claims
        )
    }

    /// How many rows the destination's table for this kind holds in all.
    pub fn table_rows(self, t: &TableRows) -> u64 {
        match self {
            Self::Secrets => t.secrets,
            Self::Identities => t.identities,
            Self::ToolHeaders => t.tool_headers,
            Self::Tasks => t.tasks,
            Self::SeenMarks => t.seen_marks,
            Self::Tombstones => t.tombstones,
            Self::Claims => t.claims,
            Self::Sessions => t.sessions,
        }
    }
}

/// One kind's counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Entries of the source to copy.
    pub source: u64,
    /// Written by this run.
    pub copied: u64,
    /// Already in the destination with the same content (an earlier run's).
    pub already: u64,
    /// In the destination with other content, which was kept (non-strict kinds).
    pub kept: u64,
    /// Entries of the source left out because the source itself reads them as absent
    /// (idempotency claims whose task and tombstone are both gone).
    pub skipped: u64,
}

impl Tally {
    /// The source's entries the destination holds now.
    pub fn in_destination(&self) -> u64 {
        self.copied + self.already + self.kept
    }

    pub fn matches(&self) -> bool {
        self.in_destination() == self.source
    }
}

/// A task whose call was in flight when the sled store was last closed: it is failed
/// in the destination with a reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFlight {
    pub task_id: String,
    pub tenant: String,
    pub tool: String,
    /// When the task was created (its call started then).
    pub since_ms: u64,
    /// An earlier run already wrote it failed.
    pub failed_before: bool,
}

/// Everything one run counted.
#[derive(Debug, Clone, Default)]
pub struct Report {
    tallies: [Tally; 8],
    pub in_flight: Vec<InFlight>,
    /// Request routes in the source (calls in flight when it closed; not copied).
    pub routes: u64,
    /// Rows each table of the destination holds after the run.
    pub tables: TableRows,
}

impl Report {
    pub fn tally(&self, kind: Kind) -> &Tally {
        &self.tallies[kind as usize]
    }

    pub(super) fn tally_mut(&mut self, kind: Kind) -> &mut Tally {
        &mut self.tallies[kind as usize]
    }

    /// Every kind's count in the destination matches the source's.
    pub fn matches(&self) -> bool {
        Kind::ALL.iter().all(|k| self.tally(*k).matches())
    }

    /// Rows this run wrote, over every kind.
    pub fn copied(&self) -> u64 {
        Kind::ALL.iter().map(|k| self.tally(*k).copied).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_matches_when_every_source_entry_is_accounted_for() {
        let mut r = Report::default();
        assert!(r.matches(), "nothing to copy matches");
        *r.tally_mut(Kind::Tasks) = Tally {
            source: 10,
            copied: 4,
            already: 6,
            ..Tally::default()
        };
        *r.tally_mut(Kind::Identities) = Tally {
            source: 2,
            copied: 1,
            kept: 1,
            ..Tally::default()
        };
        *r.tally_mut(Kind::Claims) = Tally {
            source: 3,
            copied: 3,
            skipped: 2,
            ..Tally::default()
        };
        assert!(r.matches());
        assert_eq!(r.copied(), 8);
        r.tally_mut(Kind::Tasks).already = 5;
        assert!(!r.matches(), "one task missing");
    }
}
