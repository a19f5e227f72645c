"""The one tuning stack of tvm_ext: builder, runner, search, database, tasks, report.

Everything that tunes -- ``tvm-ext tune``, the benchmarks, the tests -- goes through
these modules:

``database``  work dirs and their JSONDatabase (create, reopen, repair, records, best)
``builder``   LocalBuilder without the per-worker tensor-intrinsic import
``runner``    local or RPC runner
``search``    search strategy and the stop callback
``sampling``  candidates of a design space (what MetaSchedule would measure)
``driver``    tune a workload task by task (``tune_task`` is the one tuning call); the report
``kernels``   tune a dict of named kernels into one database, keeping the measurement order
``apply``     compile and run a workload with a database's schedules
``picks``     the records picked inside the network (``bench.in_network``), which ``apply`` compiles with
``best``      the best schedules of a database for a user's own TIR module, compiled
``logs``      MetaSchedule's loggers, quiet and safe to create again (pytest >= 9.2)
``transfer``  old schedules replayed on tasks whose TIR changed (``--reuse-schedules``)
``prune``     drop the records of modules that are no longer a task of the work dir
``packed``    saved databases gzip-compressed, read as plain ones; unpacked before appending
``save``      copy a work dir, kernel databases or a bench JSON into tuning_logs/, pruned and packed
"""
from tvm_ext.tune.apply import (apply_database, compile_workload, device_for, kernels_of,
                                make_vm, run_workload, scheduled_mod)
from tvm_ext.tune.best import NoTuningRecord, best_module, compile_best
from tvm_ext.tune.builder import BUILD_TIMEOUT_S, fast_local_builder, make_builder
from tvm_ext.tune.database import (DB_FILES, META_FILE, DatabaseCorrupt, DatabaseMismatch,
                                   DatabaseState, WorkDirError, best_record, check_database,
                                   check_instructions,
                                   SAVED_ROOT, WORK_ROOT, databases_root, default_work_dir, open_database,
                                   prepare_work_dir, read_meta,
                                   record_seconds, records_of, repair_database, write_meta)
from tvm_ext.tune.driver import (Task, add_tuning_seconds, extract_tasks, load_tasks, report,
                                 save_tasks, task_logger, tune, tune_task)
from tvm_ext.tune.kernels import kernel_database, trials_to_beat, tune_kernels
from tvm_ext.tune.prune import prune
from tvm_ext.tune.save import save
from tvm_ext.tune.runner import make_runner
from tvm_ext.tune.search import TuningInterrupted, search_strategy, stop_callback
