/* The C part of the course's warm launches (tools/zygote.py says why and how).

   A process that has imported torch forks, and the child runs a script or a module as
   `python SCRIPT` or `python -m MODULE` would. Forking and starting the script happen
   here, in a thread of our own that holds no Python frames, so that the script's
   `<module>` frame is the first of its stack (as py-spy, a traceback and `inspect`
   see it), and the child ends as the interpreter's own main() ends: Py_FinalizeEx,
   then exit(). Everything else (what to run, in which environment, folder and
   streams) is decided by Python functions of tools/zygote.py, called from here:

       next_request()          -> a request, or None to stop serving
       forked(request, pid)    in the parent, once the child exists
       become(request)         in the child -> an action
       after_fork(pid)         after an action ("fork",): in both -> an action

   Actions: ("run_file", PATH), ("run_module", NAME), ("exit", CODE), ("serve",) (this
   process serves requests from now on), ("fork",) (fork once more). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static PyObject *helper; /* the module with the functions above */

/* fork(), with every signal blocked in this thread until the child has set its handlers
   (`become` unblocks them): a signal meant for the child must not run the server's
   handler in it. In the parent, the mask is restored at once. */
static pid_t fork_quietly(void) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    fflush(NULL);
    PyOS_BeforeFork();
    pid_t pid = fork();
    if (pid == 0) {
        PyOS_AfterFork_Child();
    } else {
        PyOS_AfterFork_Parent();
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    return pid;
}

/* As Py_RunMain ends: finalize, then leave through the default SIGINT handler if a
   KeyboardInterrupt went unhandled (CPython 3.11 keeps that flag in this variable;
   where it is missing, such a run exits with status 1 instead). */
static void finish(int exitcode, int interrupted) {
    int *unhandled = (int *)dlsym(RTLD_DEFAULT, "_Py_UnhandledKeyboardInterrupt");
    interrupted = interrupted || (unhandled != NULL && *unhandled);
    if (Py_FinalizeEx() < 0) {
        exitcode = 120;
    }
    if (interrupted) {
        signal(SIGINT, SIG_DFL);
        kill(getpid(), SIGINT);
        exitcode = 128 + SIGINT;
    }
    exit(exitcode);
}

/* `python SCRIPT`: the file runs in __main__ (PyRun_AnyFileExFlags prints an uncaught
   exception, and leaves through Py_Exit on SystemExit, as for any script). */
static void run_file(const char *path) {
    FILE *fp = fopen(path, "rb");
    if (fp == NULL) {
        fprintf(stderr, "warm python: can't open file '%s'\n", path);
        finish(2, 0);
    }
    PyCompilerFlags flags = _PyCompilerFlags_INIT;
    finish(PyRun_AnyFileExFlags(fp, path, 1, &flags) != 0, 0);
}

/* `python -m MODULE`: runpy._run_module_as_main(MODULE, True), called from C as
   Python's main() calls it. */
static void run_module(const char *name) {
    PyObject *result = NULL, *runpy = PyImport_ImportModule("runpy");
    if (runpy != NULL) {
        result = PyObject_CallMethod(runpy, "_run_module_as_main", "sO", name, Py_True);
        Py_DECREF(runpy);
    }
    if (result == NULL) {
        /* as pymain_run_module: a KeyboardInterrupt itself, not a subclass */
        int interrupted = PyErr_Occurred() == PyExc_KeyboardInterrupt;
        PyErr_Print();
        finish(1, interrupted);
    }
    Py_DECREF(result);
    finish(0, 0);
}

static void serve(void);

/* Carry out an action returned by the helper (it owns `action`). Returns only for
   ("serve",), the caller then serves. */
static void act(PyObject *action) {
    for (;;) {
        const char *kind, *text = NULL;
        PyObject *argument = NULL, *encoded = NULL;
        if (action == NULL || !PyArg_ParseTuple(action, "s|O", &kind, &argument)) {
            PyErr_Print();
            _exit(70);
        }
        if (argument != NULL && PyUnicode_Check(argument)) {
            /* a path as the file system spells it (surrogates included) */
            encoded = PyUnicode_EncodeFSDefault(argument);
            text = encoded == NULL ? NULL : PyBytes_AS_STRING(encoded);
        }
        if (strcmp(kind, "run_file") == 0 && text != NULL) {
            run_file(text);
        } else if (strcmp(kind, "run_module") == 0 && text != NULL) {
            run_module(text);
        } else if (strcmp(kind, "exit") == 0 && argument != NULL) {
            finish((int)PyLong_AsLong(argument), 0);
        } else if (strcmp(kind, "serve") == 0) {
            Py_XDECREF(encoded);
            Py_DECREF(action);
            return;
        } else if (strcmp(kind, "fork") == 0) {
            Py_XDECREF(encoded);
            Py_DECREF(action);
            pid_t pid = fork_quietly();
            action = PyObject_CallMethod(helper, "after_fork", "i", (int)pid);
            continue;
        } else {
            fprintf(stderr, "warm python: unknown action %s\n", kind);
            _exit(70);
        }
    }
}

/* Serve requests until next_request() says stop; each child leaves through act(). */
static void serve(void) {
    for (;;) {
        PyObject *request = PyObject_CallMethod(helper, "next_request", NULL);
        if (request == NULL) {
            PyErr_Print();
            return;
        }
        if (request == Py_None) {
            Py_DECREF(request);
            return;
        }
        pid_t pid = fork_quietly();
        if (pid == 0) {
            setsid(); /* first: a session and group of its own (Popen's start_new_session) */
            act(PyObject_CallMethod(helper, "become", "O", request));
            Py_DECREF(request);
            continue; /* ("serve",): this child serves requests of its own */
        }
        PyObject *done = PyObject_CallMethod(helper, "forked", "Oi", request, (int)pid);
        if (done == NULL) {
            PyErr_Print();
        }
        Py_XDECREF(done);
        Py_DECREF(request);
    }
}

static void *serving_thread(void *unused) {
    (void)unused;
    PyGILState_STATE state = PyGILState_Ensure();
    serve();
    PyObject *done = PyObject_CallMethod(helper, "stopped", NULL);
    Py_XDECREF(done);
    PyGILState_Release(state);
    return NULL;
}

/* Start serving in a new thread (called through ctypes.PyDLL, with the GIL held).
   Returns 0, or an errno value. */
int warm_fork_start(PyObject *module) {
    pthread_t thread;
    pthread_attr_t attr;
    Py_INCREF(module);
    helper = module;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int error = pthread_create(&thread, &attr, serving_thread, NULL);
    pthread_attr_destroy(&attr);
    return error;
}
