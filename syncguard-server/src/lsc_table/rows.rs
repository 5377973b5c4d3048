//! The rows LSC's statements answer with, read by column name: lease duration, expiry and
//! fence are all BIGINT, so a row read by position would still decode after a SELECT's
//! columns were reordered, with two of them swapped. Read by name, a reordered SELECT is read
//! right, and a column renamed or missing fails the read.

use sqlx::postgres::PgRow;
use sqlx::{Decode, Postgres, Row, Type};
use syncguard::LockError;

/// The value of `column` in `row`.
pub(super) fn read<'r, T>(row: &'r PgRow, column: &str) -> Result<T, LockError>
where
    T: Decode<'r, Postgres> + Type<Postgres>,
{
    row.try_get(column).map_err(|error| {
        LockError::internal(format!(
            "unexpected column {column} in a result on the LSC table"
        ))
        .with_source(error)
    })
}

/// What the acquire statement answers for a lock taken.
pub(super) struct Taken {
    /// LSC's expiry, in Unix seconds.
    pub(super) expiry: i64,
    pub(super) fence: Option<i64>,
}

impl Taken {
    pub(super) fn read(row: &PgRow) -> Result<Self, LockError> {
        Ok(Self {
            expiry: read(row, "expiry")?,
            fence: read(row, "fence")?,
        })
    }
}

/// A live lock, as both lookups answer it (the lookup by key without the key's two parts).
pub(super) struct Found {
    pub(super) owner: String,
    pub(super) instance_id: String,
    /// In seconds.
    pub(super) lease_duration: i64,
    /// LSC's expiry, in Unix seconds.
    pub(super) expiry: i64,
    pub(super) fence: Option<i64>,
}

impl Found {
    pub(super) fn read(row: &PgRow) -> Result<Self, LockError> {
        Ok(Self {
            owner: read(row, "owner")?,
            instance_id: read(row, "instance_id")?,
            lease_duration: read(row, "lease_duration")?,
            expiry: read(row, "expiry")?,
            fence: read(row, "fence")?,
        })
    }
}
